// HealthHub over a real Unix socket, as the kubelet reads it: the full
// state at once, the newest after each change (an unchanged state sends
// nothing), a device's last_updated_time kept until its health changes,
// and every stream ended when the hub stops; a v1 stream (1.37) carries
// the same state as a v1alpha1 one.
#include "proxy/kubelet_side/dra/health_hub.h"

#include <grpcpp/client_context.h>
#include <grpcpp/server_builder.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/dra_health/v1/api.grpc.pb.h"
#include "proto/dra_health/v1alpha1/api.grpc.pb.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

namespace health = ::v1alpha1;
using Health = DeviceHealthEntry::Health;

std::map<std::string, int> Summary(const health::NodeWatchResourcesResponse& m) {
  std::map<std::string, int> out;
  for (const auto& d : m.devices()) {
    out[d.device().pool_name() + "/" + d.device().device_name()] = d.health();
  }
  return out;
}

TEST(HealthHubTest, StreamsTheWholeStateAtOnceAndAfterEachChange) {
  testing::ShortTempDir dir;
  HealthHub hub;
  grpc::ServerBuilder b;
  b.AddListeningPort(UnixAddress(dir.Sub("dra.sock")), grpc::InsecureServerCredentials());
  for (grpc::Service* service : hub.services()) b.RegisterService(service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  hub.SetPool("node-1/a.com-x", {{"x-0", Health::kHealthy, ""}, {"x-1", Health::kHealthy, ""}}, t0);

  auto stub = health::DRAResourceHealth::NewStub(MakeUnixChannel(dir.Sub("dra.sock")));
  grpc::ClientContext ctx;
  auto reader = stub->NodeWatchResources(&ctx, health::NodeWatchResourcesRequest());
  health::NodeWatchResourcesResponse m;
  ASSERT_TRUE(reader->Read(&m));
  EXPECT_EQ(Summary(m), (std::map<std::string, int>{{"node-1/a.com-x/x-0", health::HEALTHY},
                                                     {"node-1/a.com-x/x-1", health::HEALTHY}}));
  EXPECT_EQ(m.devices(0).last_updated_time(), 1000);
  EXPECT_EQ(hub.streams(), 1);

  // The same state again sends nothing; a change (and a second pool) does.
  hub.SetPool("node-1/a.com-x", {{"x-0", Health::kHealthy, ""}, {"x-1", Health::kHealthy, ""}},
              t0 + absl::Seconds(5));
  hub.SetPool("node-1/a.com-x",
              {{"x-0", Health::kHealthy, ""}, {"x-1", Health::kUnhealthy, "reports Unhealthy"}},
              t0 + absl::Seconds(10));
  ASSERT_TRUE(reader->Read(&m));
  EXPECT_EQ(Summary(m)["node-1/a.com-x/x-1"], health::UNHEALTHY);
  for (const auto& d : m.devices()) {
    // Only the device that changed has a new time.
    EXPECT_EQ(d.last_updated_time(), d.device().device_name() == "x-1" ? 1010 : 1000);
    EXPECT_EQ(d.message(), d.device().device_name() == "x-1" ? "reports Unhealthy" : "");
  }
  hub.SetPool("node-1/b.com-y", {{"y-0", Health::kUnknown, "no plugin"}}, t0);
  ASSERT_TRUE(reader->Read(&m));
  EXPECT_EQ(m.devices_size(), 3);
  EXPECT_EQ(Summary(m)["node-1/b.com-y/y-0"], health::UNKNOWN);

  // A second stream, of the v1 service, gets the current state at once,
  // the same bytes.
  auto stub_v1 = ::v1::DRAResourceHealth::NewStub(MakeUnixChannel(dir.Sub("dra.sock")));
  grpc::ClientContext ctx2;
  auto reader2 = stub_v1->NodeWatchResources(&ctx2, health::NodeWatchResourcesRequest());
  health::NodeWatchResourcesResponse m1;
  ASSERT_TRUE(reader2->Read(&m1));
  EXPECT_EQ(m1.devices_size(), 3);
  EXPECT_EQ(m1.SerializeAsString(), m.SerializeAsString());

  // Stopping ends both, OK.
  hub.Stop();
  EXPECT_FALSE(reader->Read(&m));
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_FALSE(reader2->Read(&m1));
  EXPECT_TRUE(reader2->Finish().ok());
  server->Shutdown();
  EXPECT_EQ(hub.streams(), 0);
}

}  // namespace
}  // namespace dpproxy
