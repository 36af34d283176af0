// DraServer as the kubelet sees it: the plugin-watcher registration socket
// and the DRA service on real Unix sockets, both proto packages, errors per
// claim, behind a ClaimPreparer with the API-server simulator and a mock
// device plugin.
#include "proxy/kubelet_side/dra/dra_server.h"

#include <atomic>
#include <filesystem>
#include <thread>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/dra/v1/api.grpc.pb.h"
#include "proto/dra/v1beta1/api.grpc.pb.h"
#include "proto/pluginregistration/api.grpc.pb.h"
#include "proxy/core/allocator.h"
#include "proxy/core/resource.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"
#include "tests/testing/mock_backend.h"
#include "tests/testing/temp_dir.h"
#include "tools/apiserver_sim/apiserver_sim.h"

namespace dpproxy {
namespace {

using ::testing::_;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::NiceMock;
using ::testing::SaveArg;
using Json = nlohmann::json;
namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

constexpr char kDriver[] = "gpu.vendor.com";
constexpr char kPool[] = "node-1/vendor.com-gpu";

class DraServerTest : public ::testing::Test {
 protected:
  DraServerTest() : api_(sim::ApiServerSim::Options{"", "", "", {"v1"}}) {}
  void SetUp() override {
    ASSERT_TRUE(api_.Start().ok());
    KubeConfig c;
    c.server = api_.url();
    client_ = *KubeClient::Create(c);
    backend_ = std::make_shared<NiceMock<testing::MockBackend>>();
    ON_CALL(*backend_, Allocate(_, _, _)).WillByDefault([](const v1beta1::AllocateRequest& req,
                                                             absl::Duration, auto*) {
      v1beta1::AllocateResponse resp;
      for (int i = 0; i < req.container_requests_size(); ++i) {
        (*resp.add_container_responses()->mutable_envs())["GPU"] =
            req.container_requests(i).devices_ids(0);
      }
      return absl::StatusOr<v1beta1::AllocateResponse>(resp);
    });
    // The plugin's resource, listing both devices.
    ON_CALL(*backend_, Start(_)).WillByDefault(SaveArg<0>(&backend_->callbacks));
    resource_.AttachBackend(backend_);
    std::vector<v1beta1::Device> devices(2);
    devices[0].set_id("gpu-0");
    devices[1].set_id("gpu-1");
    for (auto& d : devices) d.set_health("Healthy");
    backend_->callbacks.on_devices(DeviceList::FromDevices(std::move(devices)));
    ClaimPreparer::Options o;
    o.driver = kDriver;
    o.node = "node-1";
    o.cdi_dir = dir_.Sub("cdi");
    // No journal: prepared claims are kept in memory.
    std::shared_ptr<Backend> b = backend_;
    Allocator* alloc = &allocator_;
    preparer_ = std::make_unique<ClaimPreparer>(
        o, client_.get(), [b, alloc](const std::string& pool) -> std::optional<BridgedResource> {
          if (pool != kPool) return std::nullopt;
          return BridgedResource{"vendor.com/gpu", b, {"gpu-0", "gpu-1"}, alloc};
        });
    server_ = std::make_unique<DraServer>(
        DraServer::Options{dir_.Sub("k"), kDriver, [this] { ++registrations_; }},
        preparer_.get(), &events_);
    ASSERT_TRUE(server_->Start().ok());
  }
  std::string AllocatedClaim(const std::string& name, const std::string& device) {
    Json claim = {{"metadata", {{"namespace", "default"}, {"name", name}}},
                  {"status",
                   {{"allocation",
                     {{"devices",
                       {{"results",
                         {{{"request", "gpu"}, {"driver", kDriver}, {"pool", kPool},
                           {"device", device}}}}}}}}}}};
    return api_.PutClaim(claim)["metadata"]["uid"];
  }

  testing::ShortTempDir dir_;
  sim::ApiServerSim api_;
  EventLog events_{"test"};
  std::unique_ptr<KubeClient> client_;
  std::shared_ptr<NiceMock<testing::MockBackend>> backend_;
  Resource resource_{"vendor.com/gpu", ResourcePolicy(), &events_};
  Allocator allocator_{&resource_, nullptr, nullptr};
  std::unique_ptr<ClaimPreparer> preparer_;
  std::unique_ptr<DraServer> server_;
  std::atomic<int> registrations_{0};  // on_registered calls
};

TEST_F(DraServerTest, RegistersThroughThePluginWatcherNewestServiceFirst) {
  EXPECT_EQ(server_->registration_socket(), dir_.Sub("k/plugins_registry/gpu.vendor.com-reg.sock"));
  auto reg = pluginregistration::Registration::NewStub(MakeUnixChannel(server_->registration_socket()));
  grpc::ClientContext ctx;
  pluginregistration::PluginInfo info;
  ASSERT_TRUE(reg->GetInfo(&ctx, pluginregistration::InfoRequest(), &info).ok());
  EXPECT_EQ(info.type(), "DRAPlugin");
  EXPECT_EQ(info.name(), kDriver);
  EXPECT_EQ(info.endpoint(), dir_.Sub("k/plugins/gpu.vendor.com/dra.sock"));
  EXPECT_THAT(info.supported_versions(),
              ElementsAre("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                          "v1alpha1.DRAResourceHealth"));
  EXPECT_FALSE(server_->registered());
  grpc::ClientContext ctx2;
  pluginregistration::RegistrationStatus st;
  st.set_plugin_registered(true);
  pluginregistration::RegistrationStatusResponse r;
  ASSERT_TRUE(reg->NotifyRegistrationStatus(&ctx2, st, &r).ok());
  EXPECT_TRUE(server_->registered());
  EXPECT_EQ(registrations_.load(), 1);  // the server republishes on it
  // A refusal is no registration.
  grpc::ClientContext ctx3;
  st.set_plugin_registered(false);
  st.set_error("no");
  ASSERT_TRUE(reg->NotifyRegistrationStatus(&ctx3, st, &r).ok());
  EXPECT_FALSE(server_->registered());
  EXPECT_EQ(registrations_.load(), 1);
}

TEST_F(DraServerTest, BothPackagesPrepareAndErrorsStayWithTheirClaim) {
  const std::string good = AllocatedClaim("good", "gpu-1");
  auto channel = MakeUnixChannel(server_->service_socket());
  auto v1 = drav1::DRAPlugin::NewStub(channel);
  drav1::NodePrepareResourcesRequest req;
  auto* c = req.add_claims();
  c->set_namespace_("default");
  c->set_name("good");
  c->set_uid(good);
  auto* bad = req.add_claims();
  bad->set_namespace_("default");
  bad->set_name("missing");
  bad->set_uid("0badc0de-0000-4000-8000-00000000000f");
  grpc::ClientContext ctx;
  drav1::NodePrepareResourcesResponse resp;
  ASSERT_TRUE(v1->NodePrepareResources(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.claims().count(good), 1u);
  const auto& ok = resp.claims().at(good);
  EXPECT_EQ(ok.error(), "");
  ASSERT_EQ(ok.devices_size(), 1);
  EXPECT_EQ(ok.devices(0).pool_name(), kPool);
  EXPECT_EQ(ok.devices(0).device_name(), "gpu-1");
  EXPECT_THAT(ok.devices(0).request_names(), ElementsAre("gpu"));
  EXPECT_THAT(ok.devices(0).cdi_device_ids(),
              ElementsAre(absl::StrCat("gpu.vendor.com/claim=", good, "-gpu")));
  EXPECT_THAT(resp.claims().at("0badc0de-0000-4000-8000-00000000000f").error(),
              HasSubstr("not found"));

  // v1beta1: the same core (the claim is already prepared: the same answer).
  auto v1beta1 = drav1beta1::DRAPlugin::NewStub(channel);
  drav1beta1::NodePrepareResourcesRequest req2;
  auto* c2 = req2.add_claims();
  c2->set_namespace_("default");
  c2->set_name("good");
  c2->set_uid(good);
  grpc::ClientContext ctx2;
  drav1beta1::NodePrepareResourcesResponse resp2;
  ASSERT_TRUE(v1beta1->NodePrepareResources(&ctx2, req2, &resp2).ok());
  EXPECT_EQ(resp2.claims().at(good).devices(0).cdi_device_ids(0),
            ok.devices(0).cdi_device_ids(0));

  drav1::NodeUnprepareResourcesRequest un;
  *un.add_claims() = *c;
  grpc::ClientContext ctx3;
  drav1::NodeUnprepareResourcesResponse unresp;
  ASSERT_TRUE(v1->NodeUnprepareResources(&ctx3, un, &unresp).ok());
  EXPECT_EQ(unresp.claims().at(good).error(), "");
  EXPECT_TRUE(events_.WaitForEvent("claim_unprepared", {{"uid", good}}, absl::ZeroDuration()));
}

TEST_F(DraServerTest, StopRemovesBothSockets) {
  const std::string reg = server_->registration_socket(), svc = server_->service_socket();
  ASSERT_TRUE(PathExists(reg) && PathExists(svc));
  server_->Stop();
  EXPECT_FALSE(PathExists(reg));
  EXPECT_FALSE(PathExists(svc));
}

// As a handoff's gate: a prepare that arrives while held waits (the
// server's own preparer is never asked), and once forwarded it is answered
// by the successor's server, the other socket generation, with the
// kubelet's deadline; after a handed-over stop the registration socket is
// gone by a rename, with nothing left behind.
TEST_F(DraServerTest, HeldCallsAreForwardedToTheSuccessorsSocket) {
  DraServer successor(DraServer::Options{dir_.Sub("k"), kDriver, nullptr, 1}, preparer_.get(),
                      &events_);
  ASSERT_TRUE(successor.Start().ok());
  EXPECT_EQ(successor.service_socket(), dir_.Sub("k/plugins/gpu.vendor.com/dra-1.sock"));
  EXPECT_EQ(successor.registration_socket(),
            dir_.Sub("k/plugins_registry/gpu.vendor.com-reg-1.sock"));
  EXPECT_EQ(server_->gate_name(), "dra:gpu.vendor.com");
  const std::string uid = AllocatedClaim("held", "gpu-0");

  server_->HoldCalls();
  ASSERT_TRUE(server_->WaitForCallsServed(absl::Seconds(1)));  // none in progress
  drav1::NodePrepareResourcesResponse resp;
  grpc::Status status;
  absl::Notification answered;
  std::thread kubelet([&] {
    auto v1 = drav1::DRAPlugin::NewStub(MakeUnixChannel(server_->service_socket()));
    drav1::NodePrepareResourcesRequest req;
    auto* c = req.add_claims();
    c->set_namespace_("default");
    c->set_name("held");
    c->set_uid(uid);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    status = v1->NodePrepareResources(&ctx, req, &resp);
    answered.Notify();
  });
  // Held: no answer, and nothing reached the plugin.
  EXPECT_FALSE(answered.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  EXPECT_EQ(preparer_->prepared_claims(), 0);
  EXPECT_EQ(server_->ForwardCalls(successor.service_socket()), 1u);
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  kubelet.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(resp.claims().at(uid).error(), "");
  ASSERT_EQ(resp.claims().at(uid).devices_size(), 1);
  EXPECT_EQ(resp.claims().at(uid).devices(0).device_name(), "gpu-0");

  const std::string registration = server_->registration_socket();
  server_->Stop(/*handed_over=*/true);
  std::vector<std::string> left;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir_.Sub("k/plugins_registry"), ec)) {
    left.push_back(f.path().filename().string());
  }
  EXPECT_THAT(left, ElementsAre("gpu.vendor.com-reg-1.sock"));
  EXPECT_FALSE(PathExists(registration));
}

}  // namespace
}  // namespace dpproxy
