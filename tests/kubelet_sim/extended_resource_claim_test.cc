// A pod whose extended resource the scheduler served through DRA
// (KEP-5004): the kubelet sim gives its mapped containers their devices
// from the claim, never from the device plugin. What it refuses, and how:
// a kubelet whose DRAExtendedResource gate is off by default (before 1.36), a mapping that names nothing in the pod, and a
// claim the driver cannot prepare (the pod waits; nothing is recorded and
// the device plugin is not called). The prepared path runs end to end in
// tests/proxy/dra_mode_test.cc with dpproxy as the driver.
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/sim_helpers.h"
#include "tests/testing/temp_dir.h"
#include "tools/kubelet_sim/kubelet_sim.h"
#include "tools/sample_plugin/sample_plugin.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;

constexpr char kGpu[] = "vendor.com/gpu";

class ExtendedResourceClaimTest : public ::testing::Test {
 protected:
  void Start(const std::string& kubelet) {
    sim::KubeletSimOptions o;
    o.root_dir = dir_.Sub("kubelet");
    absl::StatusOr<sim::KubeletVersion> k = sim::ParseKubeletVersion(kubelet);
    ASSERT_TRUE(k.ok()) << k.status();
    o.kubelet = *k;
    sim_ = std::make_unique<sim::KubeletSim>(o);
    ASSERT_TRUE(sim_->Start().ok());
    sample::SamplePluginOptions p;
    p.resource = kGpu;
    p.devices = 2;
    p.id_pattern = "gpu-{i}";
    p.kubelet_socket = sim_->kubelet_socket();
    plugin_ = std::make_unique<sample::SamplePlugin>(p);
    ASSERT_TRUE(plugin_->Start().ok());
    ASSERT_TRUE(sim_->WaitForResource(kGpu, 2, absl::Seconds(10)));
  }
  // A pod of one container asking for one device, served through the
  // claim default/train-x.
  static sim::AllocateRequest ServedByClaim(const std::string& container) {
    sim::AllocateRequest req = testing::PodRequest("train", {{"main", 1}}, kGpu);
    sim::ExtendedResourceClaim* e = req.mutable_extended_resource_claim();
    e->set_namespace_("default");
    e->set_name("train-x");
    e->set_uid("00000000-0000-4000-8000-000000000001");
    e->set_driver("gpu.vendor.com");
    auto* m = e->add_request_mappings();
    m->set_container(container);
    m->set_resource(kGpu);
    m->set_request("container-0-request-0");
    return req;
  }

  testing::ShortTempDir dir_;
  std::unique_ptr<sim::KubeletSim> sim_;
  std::unique_ptr<sample::SamplePlugin> plugin_;
};

TEST_F(ExtendedResourceClaimTest, AKubeletWhoseGateIsOffHasNoSuchPods) {
  Start("1.35");
  absl::Status s = sim_->Allocate(ServedByClaim("main")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("need kubelet 1.36 or later, where DRAExtendedResource is on"));
  EXPECT_EQ(sim_->GetState().pods_size(), 0);
}

TEST_F(ExtendedResourceClaimTest, AMappingMustNameTheContainersRequest) {
  Start("1.36");
  absl::Status s = sim_->Allocate(ServedByClaim("sidecar")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("container \"sidecar\" resource vendor.com/gpu, which the pod does not "
                        "ask for"));
  EXPECT_EQ(sim_->GetState().pods_size(), 0);
}

TEST_F(ExtendedResourceClaimTest, AClaimThatCannotBePreparedLeavesThePodWaiting) {
  Start("1.36");
  const size_t from = sim_->events().Size();
  absl::Status s = sim_->Allocate(ServedByClaim("main")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("waits: preparing claim default/train-x failed: DRA driver "
                        "gpu.vendor.com is not registered"));
  EXPECT_TRUE(sim_->events().WaitForEvent("pod_waits_for_claim", {{"claim", "default/train-x"}},
                                          absl::Seconds(1), from));
  // Nothing recorded, and the device plugin was never asked: the claim,
  // not the plugin, serves the container.
  EXPECT_EQ(sim_->GetState().pods_size(), 0);
  EXPECT_EQ(plugin_->Status().allocate_calls(), 0);
}

}  // namespace
}  // namespace dpproxy
