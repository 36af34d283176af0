// ForgottenAllocations through its own interface (forgotten_allocations.h):
// a real journal (StateKeeper) in a temporary kubelet root, and a fake
// kubelet pod-resources service on the real socket path, whose List the
// test sets. kubelet.sock is a plain file: its creation time is the
// kubelet's start.
#include "proxy/holders/forgotten_allocations.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kGpu[] = "vendor.com/gpu";

// The kubelet's pod-resources List: the pods the test says run.
class FakePodResources final : public v1::PodResourcesLister::Service {
 public:
  void SetPods(std::vector<std::pair<std::string, std::string>> pods) {
    absl::MutexLock lock(&mu_);
    pods_ = std::move(pods);
  }
  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* resp) override {
    absl::MutexLock lock(&mu_);
    for (const auto& [ns, name] : pods_) {
      v1::PodResources* p = resp->add_pod_resources();
      p->set_namespace_(ns);
      p->set_name(name);
      p->add_containers()->set_name("main");
    }
    return grpc::Status::OK;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<std::string, std::string>> pods_ ABSL_GUARDED_BY(mu_);
};

class ForgottenAllocationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.kubelet.kubelet_root = dir_.Sub("kubelet");
    ASSERT_TRUE(MakeDirs(DevicePluginDir(options_.kubelet)).ok());
    ASSERT_TRUE(MakeDirs(JoinPath(options_.kubelet.kubelet_root, "pod-resources")).ok());
    ASSERT_TRUE(MakeDirs(JoinPath(options_.kubelet.kubelet_root, "pods")).ok());
    ASSERT_TRUE(WriteFileAtomic(KubeletSocketPath(options_.kubelet), "").ok());
    grpc::ServerBuilder b;
    b.AddListeningPort(UnixAddress(KubeletPodResourcesSocket(options_.kubelet)),
                       grpc::InsecureServerCredentials());
    b.RegisterService(&kubelet_);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_TRUE(keeper_.Load().ok());
  }
  void TearDown() override { server_->Shutdown(); }

  // Starts the class under test; `restart_grace` zero: the kubelet started
  // long ago.
  void Start(absl::Duration restart_grace) {
    options_.restart_grace = restart_grace;
    forgotten_ = std::make_unique<ForgottenAllocations>(options_, &keeper_, &events_,
                                                        [this] { ++changed_; });
  }

  // Journals an allocation of `devices` held by pod default/`pod` (UID
  // "uid-`pod`", container main); its id.
  uint64_t Allocate(std::vector<std::string> devices, const std::string& pod) {
    v1beta1::AllocateRequest one;
    auto* c = one.add_container_requests();
    for (const std::string& d : devices) c->add_devices_ids(d);
    v1beta1::AllocateResponse resp;
    resp.add_container_responses();
    EXPECT_TRUE(keeper_.Record(kGpu, one, resp, "v1beta1", "/s").ok());
    const uint64_t id = keeper_.AllocationsSnapshot().next_allocation_id();
    EXPECT_TRUE(keeper_.Reconcile({{id, "default", pod, "main", "uid-" + pod}}, {}).ok());
    return id;
  }
  void PodDirectory(const std::string& pod) {
    ASSERT_TRUE(MakeDirs(JoinPath(options_.kubelet.kubelet_root, "pods/uid-" + pod)).ok());
  }

  testing::ShortTempDir dir_;
  EventLog events_{"test"};
  StateKeeper keeper_{dir_.Sub("state.pb"), &events_};
  FakePodResources kubelet_;
  std::unique_ptr<grpc::Server> server_;
  ForgottenAllocations::Options options_;
  std::unique_ptr<ForgottenAllocations> forgotten_;
  int changed_ = 0;
};

// Marked allocations are listed with their holders for the status and for
// steering, and a device the kubelet handed out again since is counted as
// held twice, with an event naming both holders.
TEST_F(ForgottenAllocationsTest, MarkedAllocationsAreListedAndADeviceHandedOutAgainIsHeldTwice) {
  Start(absl::ZeroDuration());
  const uint64_t a = Allocate({"gpu-0"}, "a");
  const uint64_t b = Allocate({"gpu-1"}, "b");
  Allocate({"gpu-1"}, "c");  // the kubelet, having lost b, handed gpu-1 out again
  const uint64_t version = forgotten_->version();

  forgotten_->Mark({a, b}, "the kubelet restarted without its checkpoint");

  EXPECT_GT(forgotten_->version(), version);
  EXPECT_EQ(changed_, 1);
  std::vector<ForgottenStatus> rows;
  const auto devices = forgotten_->Devices(&rows);
  ASSERT_EQ(devices.count(kGpu), 1u);
  EXPECT_EQ(devices.at(kGpu).at("gpu-0"), "default/a/main");
  EXPECT_EQ(devices.at(kGpu).at("gpu-1"), "default/b/main");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].reason, "the kubelet restarted without its checkpoint");
  EXPECT_EQ(forgotten_->devices_held_twice(), 1);
  EXPECT_TRUE(events_
                  .WaitForEvent("device_held_twice",
                                {{"device", "gpu-1"},
                                 {"first", "default/b/main"},
                                 {"second", "default/c/main"}},
                                absl::ZeroDuration())
                  .has_value());
  // Marking again changes nothing.
  forgotten_->Mark({a}, "again");
  EXPECT_EQ(changed_, 1);
}

// An Allocate naming a forgotten device is refused, naming the holder,
// while the kubelet lists its pod; once the pod is gone from the List the
// allocation is released and the Allocate goes ahead.
TEST_F(ForgottenAllocationsTest, AnAllocateIsRefusedWhileTheHolderIsListedAndAllowedOnceItIsGone) {
  Start(absl::ZeroDuration());
  const uint64_t a = Allocate({"gpu-0"}, "a");
  PodDirectory("a");
  forgotten_->Mark({a}, "lost");
  kubelet_.SetPods({{"default", "a"}});

  absl::StatusOr<bool> refused = forgotten_->CheckForgotten(kGpu, {{"gpu-0", "gpu-3"}}, false);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("gpu-0 (held by pod default/a container main)"));
  EXPECT_EQ(forgotten_->StillForgotten(kGpu, {"gpu-0", "gpu-3"}), std::set<std::string>{"gpu-0"});
  EXPECT_EQ(keeper_.AllocationCount(), 1);

  kubelet_.SetPods({});
  absl::StatusOr<bool> allowed = forgotten_->CheckForgotten(kGpu, {{"gpu-0"}}, false);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_FALSE(*allowed);
  EXPECT_EQ(keeper_.AllocationCount(), 0);
  EXPECT_EQ(forgotten_->released(), 1);
  EXPECT_TRUE(events_.WaitForEvent("forgotten_released", {{"allocation", a}}, absl::ZeroDuration())
                  .has_value());
}

// The kubelet keeps a directory per pod on the node: a holder whose pod's
// directory is gone is released whatever the List says.
TEST_F(ForgottenAllocationsTest, AHolderWhosePodDirectoryIsGoneIsReleased) {
  Start(absl::ZeroDuration());
  const uint64_t a = Allocate({"gpu-0"}, "a");
  const uint64_t b = Allocate({"gpu-1"}, "b");
  PodDirectory("b");
  kubelet_.SetPods({{"default", "a"}, {"default", "b"}});
  forgotten_->Mark({a, b}, "lost");

  EXPECT_EQ(forgotten_->StillForgotten(kGpu, {"gpu-0", "gpu-1"}), std::set<std::string>{"gpu-1"});
  const std::optional<Json> released =
      events_.WaitForEvent("forgotten_released", {{"allocation", a}}, absl::ZeroDuration());
  ASSERT_TRUE(released.has_value());
  EXPECT_THAT((*released)["why"].get<std::string>(), HasSubstr("directory of pod uid-a is gone"));
  EXPECT_EQ(keeper_.AllocationCount(), 1);
}

// Right after the kubelet's start, a kubelet re-admitting its running
// containers (before 1.25) is steered to each forgotten container's own
// devices, oldest first, once each; a size that does not match the next
// one gets nothing.
TEST_F(ForgottenAllocationsTest, ReadmissionPicksTheOldestForgottenContainerFirstOnce) {
  Start(absl::Hours(1));
  const uint64_t a = Allocate({"gpu-0", "gpu-1"}, "a");
  const uint64_t b = Allocate({"gpu-2"}, "b");
  forgotten_->Mark({a, b}, "lost");
  const std::set<std::string> all = {"gpu-0", "gpu-1", "gpu-2", "gpu-3"};

  EXPECT_THAT(forgotten_->ReadmissionPick(kGpu, 1, all), IsEmpty());  // a has two
  EXPECT_THAT(forgotten_->ReadmissionPick(kGpu, 2, {"gpu-0", "gpu-3"}), IsEmpty());
  EXPECT_THAT(forgotten_->ReadmissionPick(kGpu, 2, all), ElementsAre("gpu-0", "gpu-1"));
  EXPECT_THAT(forgotten_->ReadmissionPick(kGpu, 1, all), ElementsAre("gpu-2"));
  EXPECT_THAT(forgotten_->ReadmissionPick(kGpu, 1, all), IsEmpty());

  // The re-admission's Allocate with a's own devices: a's record gives way.
  absl::StatusOr<bool> readmitted =
      forgotten_->CheckForgotten(kGpu, {{"gpu-0", "gpu-1"}}, /*readmission=*/true);
  ASSERT_TRUE(readmitted.ok()) << readmitted.status();
  EXPECT_FALSE(*readmitted);
  std::vector<ForgottenStatus> rows;
  const auto devices = forgotten_->Devices(&rows);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].allocation, b);
}

}  // namespace
}  // namespace dpproxy
