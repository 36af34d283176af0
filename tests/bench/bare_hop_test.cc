// bare_hop, the bench's floors: it forwards Allocate to the plugin and its
// answer back; with --journal it writes each request to its file while the
// plugin is called, and answers only once the plugin has; a journal it
// cannot make stops it with the file named.
#include <signal.h>

#include <memory>
#include <string>
#include <thread>

#include <grpcpp/server_builder.h>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/child_process.h"
#include "proxy/util/files.h"
#include "tests/testing/file_wait.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

constexpr absl::Duration kWait = absl::Seconds(20);

// A plugin whose Allocate answers each container with its devices as an
// env, once `release` is notified.
class HeldPlugin final : public v1beta1::DevicePlugin::CallbackService {
 public:
  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* ctx,
                                     const v1beta1::AllocateRequest* req,
                                     v1beta1::AllocateResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    called.Notify();
    std::thread([this, reactor, req, resp] {
      EXPECT_TRUE(release.WaitForNotificationWithTimeout(kWait));
      for (const auto& c : req->container_requests()) {
        std::string ids;
        for (const std::string& id : c.devices_ids()) ids += id;
        (*resp->add_container_responses()->mutable_envs())["DEVICES"] = ids;
      }
      reactor->Finish(grpc::Status::OK);
    }).detach();
    return reactor;
  }
  absl::Notification called, release;
};

class BareHopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterService(&plugin_);
    absl::StatusOr<std::unique_ptr<grpc::Server>> s =
        StartServerAt(builder, dir_.Sub("plugin.sock"), 0600);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  void TearDown() override {
    if (!plugin_.release.HasBeenNotified()) plugin_.release.Notify();
    if (hop_ != nullptr) testing::Kill(hop_.get(), SIGTERM);
    if (server_ != nullptr) server_->Shutdown();
  }
  void StartHop(const std::string& journal) {
    std::vector<std::string> args = {testing::Runfile("tools/bench/bare_hop"),
                                     "--listen=" + dir_.Sub("hop.sock"),
                                     "--target=" + dir_.Sub("plugin.sock")};
    if (!journal.empty()) args.push_back("--journal=" + journal);
    hop_ = testing::Spawn(args);
    ASSERT_NE(hop_, nullptr);
    ASSERT_TRUE(testing::WaitForFile(
        dir_.Sub("hop.sock"), [](const std::string&) { return true; }, kWait));
  }
  // Allocate of `device` through the hop, on a thread of its own.
  std::thread Call(const std::string& device, grpc::Status* status,
                   v1beta1::AllocateResponse* resp, absl::Notification* done) {
    return std::thread([this, device, status, resp, done] {
      absl::StatusOr<std::shared_ptr<grpc::Channel>> ch =
          DialUnixChannel(dir_.Sub("hop.sock"), kWait);
      ASSERT_TRUE(ch.ok()) << ch.status();
      auto stub = v1beta1::DevicePlugin::NewStub(*ch);
      v1beta1::AllocateRequest req;
      req.add_container_requests()->add_devices_ids(device);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
      *status = stub->Allocate(&ctx, req, resp);
      done->Notify();
    });
  }

  testing::ShortTempDir dir_;
  HeldPlugin plugin_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ChildProcess> hop_;
};

TEST_F(BareHopTest, ForwardsTheCallAndItsAnswer) {
  StartHop("");
  grpc::Status status;
  v1beta1::AllocateResponse resp;
  absl::Notification done;
  std::thread t = Call("gpu-7", &status, &resp, &done);
  ASSERT_TRUE(plugin_.called.WaitForNotificationWithTimeout(kWait));
  EXPECT_FALSE(done.HasBeenNotified()) << "answered before the plugin";
  plugin_.release.Notify();
  t.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(resp.container_responses_size(), 1);
  EXPECT_EQ(resp.container_responses(0).envs().at("DEVICES"), "gpu-7");
}

TEST_F(BareHopTest, AJournalGetsTheRequestWhileThePluginIsCalled) {
  const std::string journal = dir_.Sub("hop.journal");
  StartHop(journal);
  grpc::Status status;
  v1beta1::AllocateResponse resp;
  absl::Notification done;
  std::thread t = Call("gpu-unique-41", &status, &resp, &done);
  ASSERT_TRUE(plugin_.called.WaitForNotificationWithTimeout(kWait));
  // The request's bytes reach the file while the plugin still holds its
  // answer, and the call is not answered before the plugin's.
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("gpu-unique-41");
  const std::string record = req.SerializeAsString();
  EXPECT_TRUE(testing::WaitForFile(
      journal, [&](const std::string& text) { return text.find(record) != std::string::npos; },
      kWait))
      << "the request was never written";
  EXPECT_FALSE(done.HasBeenNotified()) << "answered before the plugin";
  plugin_.release.Notify();
  t.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(resp.container_responses(0).envs().at("DEVICES"), "gpu-unique-41");
  // The file is the ring of zeros it was made as, the record at its start.
  absl::StatusOr<std::string> text = ReadFile(journal);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->size(), 8u << 20);
  EXPECT_EQ(text->substr(0, record.size()), record);
  EXPECT_EQ(text->find_first_not_of('\0', record.size()), std::string::npos);
}

TEST_F(BareHopTest, AJournalItCannotMakeStopsItWithTheFileNamed) {
  const std::string journal = dir_.Sub("no-such-dir/hop.journal");
  ChildSpec spec;
  spec.argv = {testing::Runfile("tools/bench/bare_hop"), "--listen=" + dir_.Sub("hop.sock"),
               "--target=" + dir_.Sub("plugin.sock"), "--journal=" + journal};
  spec.output_path = dir_.Sub("hop.log");
  absl::StatusOr<std::unique_ptr<ChildProcess>> hop = ChildProcess::Start(spec);
  ASSERT_TRUE(hop.ok()) << hop.status();
  const std::optional<int> exit = (*hop)->Wait(kWait);
  ASSERT_TRUE(exit.has_value()) << "bare_hop did not stop";
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 1) << ChildProcess::DescribeExit(*exit);
  absl::StatusOr<std::string> log = ReadFile(dir_.Sub("hop.log"));
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_NE(log->find("cannot open " + journal + ": No such file or directory"),
            std::string::npos)
      << *log;
  EXPECT_FALSE(PathExists(dir_.Sub("hop.sock")));
}

}  // namespace
}  // namespace dpproxy
