// The 1.25-1.36 registration handler's map of clients by resource name,
// apart from the device manager's endpoints: a registration that fails
// after the kubelet entered it (GetDevicePluginOptions refused) deletes the
// name's entry; the client that held it keeps serving, and the end of its
// stream then disconnects nothing (the kubelet's connectClient and
// runClient). Real gRPC servers on real Unix sockets; the failing
// registration is dpproxy's own (proxy/kubelet_side/device_plugin/client_name_release.h).
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/kubelet_side/device_plugin/client_name_release.h"
#include "tests/testing/sim_helpers.h"
#include "tests/testing/temp_dir.h"
#include "tools/kubelet_sim/kubelet_sim.h"
#include "tools/sample_plugin/sample_plugin.h"

namespace dpproxy {
namespace {

using sample::SamplePlugin;
using sample::SamplePluginOptions;
using sim::KubeletSim;
using sim::KubeletSimOptions;

constexpr absl::Duration kWait = absl::Seconds(10);
constexpr char kGpu[] = "vendor.com/gpu";

class ClientEntryTest : public ::testing::Test {
 protected:
  void Start(const std::string& kubelet, bool per_socket = false) {
    KubeletSimOptions o;
    o.root_dir = dir_.Sub("kubelet");
    absl::StatusOr<sim::KubeletVersion> k = sim::ParseKubeletVersion(kubelet);
    ASSERT_TRUE(k.ok()) << k.status();
    o.kubelet = *k;
    o.kubelet->per_socket_clients = per_socket;
    sim_ = std::make_unique<KubeletSim>(o);
    ASSERT_TRUE(sim_->Start().ok());
    SamplePluginOptions p;
    p.resource = kGpu;
    p.devices = 4;
    p.id_pattern = "gpu-{i}";
    p.kubelet_socket = sim_->kubelet_socket();
    plugin_ = std::make_unique<SamplePlugin>(p);
    ASSERT_TRUE(plugin_->Start().ok());
    ASSERT_TRUE(sim_->WaitForResource(kGpu, 4, kWait));
    kubelet_side_.kubelet_root = o.root_dir;
  }
  absl::Status Release() {
    return ReleaseClientName(kubelet_side_, kGpu, "dpproxy-test.sock", kWait);
  }
  bool Admits(const std::string& pod) {
    return sim_->Allocate(testing::PodRequest(pod, {{"main", 1}}, kGpu)).ok();
  }

  testing::ShortTempDir dir_;
  std::unique_ptr<KubeletSim> sim_;
  std::unique_ptr<SamplePlugin> plugin_;
  KubeletSideOptions kubelet_side_;
};

TEST_F(ClientEntryTest, AFailedRegistrationEmptiesTheNameAndTheEndOfItsClientGoesUnseen) {
  ASSERT_NO_FATAL_FAILURE(Start("1.31"));
  const size_t from = sim_->events().Size();
  ASSERT_TRUE(Release().ok());
  EXPECT_TRUE(sim_->events().WaitForEvent("client_forgotten", {{"resource", kGpu}}, kWait, from)
                  .has_value());
  // The plugin still serves the resource: its endpoint takes Allocates.
  EXPECT_TRUE(Admits("after-release"));
  // Its stream ends (it stops): nothing is disconnected, the devices stay
  // healthy in the kubelet's books.
  plugin_.reset();
  ASSERT_TRUE(sim_->events()
                  .WaitForEvent("unlisted_client_ended", {{"resource", kGpu}}, kWait, from)
                  .has_value());
  for (const nlohmann::json& e : sim_->events().Since(from)) {
    EXPECT_NE(e["event"], "plugin_lost") << e.dump();
  }
  EXPECT_TRUE(sim_->WaitForResource(kGpu, 4, absl::ZeroDuration()));
}

TEST_F(ClientEntryTest, WithClientsPerSocketOnlyTheFailedSocketsEntryGoes) {
  ASSERT_NO_FATAL_FAILURE(Start("1.31", /*per_socket=*/true));
  const size_t from = sim_->events().Size();
  ASSERT_TRUE(Release().ok());
  plugin_.reset();
  ASSERT_TRUE(sim_->events().WaitForEvent("plugin_lost", {{"resource", kGpu}}, kWait, from)
                  .has_value());
  for (const nlohmann::json& e : sim_->events().Since(from)) {
    EXPECT_NE(e["event"], "client_forgotten") << e.dump();
  }
}

TEST_F(ClientEntryTest, AKubeletThatAnswersBeforeItDialsIsNotReleased) {
  ASSERT_NO_FATAL_FAILURE(Start("1.24"));
  absl::Status s = Release();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("before 1.25"));
}

TEST(ReleaseSocketNameTest, SitsBesideTheEndpoint) {
  EXPECT_EQ(ReleaseSocketName("dpproxy-vendor.com_gpu.sock"), "dpproxy-vendor.com_gpu.release.sock");
  EXPECT_EQ(ReleaseSocketName("dpproxy-vendor.com_gpu.1.sock"),
            "dpproxy-vendor.com_gpu.1.release.sock");
  EXPECT_EQ(ReleaseSocketName("odd"), "odd.release.sock");
}

}  // namespace
}  // namespace dpproxy
