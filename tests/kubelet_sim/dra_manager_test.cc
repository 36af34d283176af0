// The simulated kubelet's DRA manager on its own (dra_manager.h): how each
// release registers drivers, keeps or replaces a second instance, and falls
// back when a registration socket goes. No driver needs to listen: the
// releases played here (1.32-1.35) watch no health stream.
#include "tools/kubelet_sim/dra_manager.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dpproxy::sim {
namespace {

using ::testing::HasSubstr;

pluginregistration::PluginInfo Info(std::vector<std::string> versions) {
  pluginregistration::PluginInfo info;
  info.set_type("DRAPlugin");
  info.set_name("gpu.example.com");
  for (const std::string& v : versions) info.add_supported_versions(v);
  return info;
}

class DraManagerTest : public ::testing::Test {
 protected:
  EventLog events_{"test"};
  DraManager dra_{{}, &events_};
};

TEST_F(DraManagerTest, EachReleaseTakesTheFirstServiceItKnows) {
  dra_.SetKubelet(33, "1.33");
  EXPECT_EQ(dra_.Register(Info({"v1.DRAPlugin", "v1beta1.DRAPlugin"}), "/a.sock", "/reg/a"), "");
  EXPECT_EQ(dra_.driver("gpu.example.com")->service, "v1beta1.DRAPlugin");
  dra_.Clear();
  EXPECT_FALSE(dra_.Serves("gpu.example.com"));

  dra_.SetKubelet(34, "1.34");
  EXPECT_EQ(dra_.Register(Info({"v1.DRAPlugin", "v1beta1.DRAPlugin"}), "/a.sock", "/reg/a"), "");
  EXPECT_EQ(dra_.driver("gpu.example.com")->service, "v1.DRAPlugin");
  EXPECT_EQ(dra_.driver("gpu.example.com")->health, "");  // 1.34 watches no health

  dra_.SetKubelet(33, "1.33");
  const std::string refused = dra_.Register(Info({"v1.DRAPlugin"}), "/b.sock", "/reg/b");
  EXPECT_THAT(refused, HasSubstr("none of the versions supported by DRA plugin gpu.example.com"));
  EXPECT_THAT(refused, HasSubstr("kubelet 1.33 (v1beta1.DRAPlugin)"));
}

// 1.33+ keep the instance a second registration replaces and fall back to
// it when the newer one's socket goes; the older one's socket going only
// forgets it.
TEST_F(DraManagerTest, From133ASecondInstanceIsKeptToFallBackTo) {
  dra_.SetKubelet(35, "1.35");
  ASSERT_EQ(dra_.Register(Info({"v1.DRAPlugin"}), "/old.sock", "/reg/old"), "");
  ASSERT_EQ(dra_.Register(Info({"v1.DRAPlugin"}), "/new.sock", "/reg/new"), "");
  EXPECT_EQ(dra_.instances("gpu.example.com"), 2);
  EXPECT_EQ(dra_.driver("gpu.example.com")->endpoint, "/new.sock");

  dra_.SocketRemoved("/reg/new", "gpu.example.com");
  EXPECT_EQ(dra_.instances("gpu.example.com"), 1);
  EXPECT_EQ(dra_.driver("gpu.example.com")->endpoint, "/old.sock");
  EXPECT_TRUE(events_.WaitForEvent("dra_driver_fallback", {{"endpoint", "/old.sock"}},
                                   absl::ZeroDuration())
                  .has_value());

  dra_.SocketRemoved("/reg/old", "gpu.example.com");
  EXPECT_FALSE(dra_.Serves("gpu.example.com"));
}

// Up to 1.32 a registration replaces the driver, and any of its
// registration sockets going deregisters it by name.
TEST_F(DraManagerTest, Before133AnySocketGoingDeregistersTheDriver) {
  dra_.SetKubelet(32, "1.32");
  ASSERT_EQ(dra_.Register(Info({"v1beta1.DRAPlugin"}), "/old.sock", "/reg/old"), "");
  ASSERT_EQ(dra_.Register(Info({"v1beta1.DRAPlugin"}), "/new.sock", "/reg/new"), "");
  EXPECT_EQ(dra_.instances("gpu.example.com"), 1);
  EXPECT_TRUE(events_.WaitForEvent("dra_driver_replaced", {{"kept", false}}, absl::ZeroDuration())
                  .has_value());

  dra_.SocketRemoved("/reg/old", "gpu.example.com");  // the replaced one's socket
  EXPECT_FALSE(dra_.Serves("gpu.example.com"));
  EXPECT_FALSE(dra_.Prepare("gpu.example.com", {{"default", "claim", "uid-1"}}).ok());
}

}  // namespace
}  // namespace dpproxy::sim
