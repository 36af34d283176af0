// The backend's ListAndWatch stream read as bytes (ListReader), against a
// plugin on a real Unix socket that writes exactly the bytes a test gives
// it: a list arrives as the same wire bytes, topology kept for v1beta1; bytes
// that are not a ListAndWatchResponse end the stream with a reason naming
// the problem, after the lists before them were delivered.
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/v1beta1/v1beta1_backend.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/rpc/grpc_util.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

// Writes `messages` (raw bytes) one after the other, then waits to be
// cancelled.
class RawPlugin final : public v1beta1::DevicePlugin::WithRawCallbackMethod_ListAndWatch<
                            v1beta1::DevicePlugin::Service> {
 public:
  explicit RawPlugin(std::vector<std::string> messages) : messages_(std::move(messages)) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* ListAndWatch(grpc::CallbackServerContext*,
                                                           const grpc::ByteBuffer*) override {
    class Writer final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
     public:
      explicit Writer(const std::vector<std::string>* messages) : messages_(messages) { Next(); }
      void OnWriteDone(bool ok) override {
        if (ok) Next();
      }
      void OnCancel() override { Finish(grpc::Status::OK); }
      void OnDone() override { delete this; }

     private:
      void Next() {
        if (next_ >= messages_->size()) return;
        grpc::Slice slice((*messages_)[next_]);
        ++next_;
        buffer_ = grpc::ByteBuffer(&slice, 1);
        StartWrite(&buffer_);
      }
      const std::vector<std::string>* messages_;
      size_t next_ = 0;
      grpc::ByteBuffer buffer_;
    };
    return new Writer(&messages_);
  }

 private:
  const std::vector<std::string> messages_;
};

// What the backend delivered, waited for with a deadline.
struct Seen {
  absl::Mutex mu;
  std::vector<std::shared_ptr<const DeviceList>> lists ABSL_GUARDED_BY(mu);
  std::optional<std::string> lost ABSL_GUARDED_BY(mu);

  BackendCallbacks Callbacks() {
    return BackendCallbacks{[this](std::shared_ptr<const DeviceList> d) {
                              absl::MutexLock lock(&mu);
                              lists.push_back(std::move(d));
                            },
                            [this](const std::string& why) {
                              absl::MutexLock lock(&mu);
                              lost = why;
                            }};
  }
  bool WaitForLost(absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto cond = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return lost.has_value(); };
    return mu.AwaitWithTimeout(absl::Condition(&cond), timeout);
  }
  bool WaitForLists(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto cond = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return lists.size() >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&cond), timeout);
  }
};

class ListReaderTest : public ::testing::Test {
 protected:
  std::unique_ptr<V1Beta1Backend> Serve(std::vector<std::string> messages) {
    plugin_ = std::make_unique<RawPlugin>(std::move(messages));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + dir_.Sub("plugin.sock"), grpc::InsecureServerCredentials());
    builder.RegisterService(plugin_.get());
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    auto ch = grpc::CreateChannel("unix:" + dir_.Sub("plugin.sock"),
                                  grpc::InsecureChannelCredentials());
    return std::make_unique<V1Beta1Backend>("vendor.com/gpu", dir_.Sub("plugin.sock"), ch,
                                            v1beta1::DevicePluginOptions());
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  testing::ShortTempDir dir_;
  std::unique_ptr<RawPlugin> plugin_;
  std::unique_ptr<grpc::Server> server_;
};

std::string List(int n, bool topology) {
  v1beta1::ListAndWatchResponse m;
  for (int i = 0; i < n; ++i) {
    v1beta1::Device* d = m.add_devices();
    d->set_id("gpu-" + std::to_string(i));
    d->set_health(i % 2 == 0 ? "Healthy" : "Unhealthy");
    if (topology) d->mutable_topology()->add_nodes()->set_id(i % 2);
  }
  return m.SerializeAsString();
}

TEST_F(ListReaderTest, ListsArriveAsTheirBytesInOrder) {
  Seen seen;
  auto backend = Serve({List(3, true), List(50000, true)});
  backend->Start(seen.Callbacks());
  ASSERT_TRUE(seen.WaitForLists(2, absl::Seconds(30)));
  absl::MutexLock lock(&seen.mu);
  EXPECT_EQ(seen.lists[0]->wire(), List(3, true));
  EXPECT_EQ(seen.lists[1]->wire(), List(50000, true));  // several slices, joined
  EXPECT_EQ(seen.lists[1]->Find("gpu-49999"), 49999);
  EXPECT_TRUE(seen.lists[0]->device(2).has_topology);
  EXPECT_FALSE(seen.lost.has_value());
}

TEST_F(ListReaderTest, BytesThatAreNotAListEndTheStreamNamingTheProblem) {
  Seen seen;
  std::string cut = List(2, false);
  cut.resize(cut.size() - 3);
  auto backend = Serve({List(2, false), cut, List(4, false)});
  backend->Start(seen.Callbacks());
  ASSERT_TRUE(seen.WaitForLost(absl::Seconds(30)));
  absl::MutexLock lock(&seen.mu);
  ASSERT_EQ(seen.lists.size(), 1u);  // the one before; nothing after
  EXPECT_EQ(seen.lists[0]->size(), 2);
  EXPECT_NE(seen.lost->find("cannot read"), std::string::npos) << *seen.lost;
  EXPECT_NE(seen.lost->find("device 1"), std::string::npos) << *seen.lost;
}

}  // namespace
}  // namespace dpproxy

// The servers' completion queues are torn down by gRPC's own threads after
// the last test; exit's static destructors would run beside them (a double
// free in gRPC's completion queue, seen once under ASan). The process ends
// without them, as dpproxy does (grpc_util.h).
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  dpproxy::EndProcess(result);
}
