// A DRA driver instance left behind by a killed dpproxy, with real
// processes: the simulated 1.36 kubelet (which, as a real one from 1.33,
// keeps each instance of a driver by its registration socket, forgetting
// one only when its socket is deleted), dpproxy in DRA mode, taken over
// (--takeover, so the successor serves the other socket generation) and
// the successor killed with SIGKILL. Its registration socket stays, and a
// dead instance with it: the kubelet would fall back to it, and a real
// 1.36 kubelet retries its health stream every 5 s. The next dpproxy must
// remove it before it registers, so that the kubelet holds exactly one
// instance, its own.
#include <signal.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/process_node.h"
#include "tools/apiserver_sim/apiserver_sim.h"

namespace dpproxy {
namespace {

using testing::ProcessNode;

constexpr absl::Duration kWait = ProcessNode::kWait;
constexpr char kDriver[] = "gpu.example.com";

class DraDeadInstanceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.Start().ok());
    api_.PutNode("node-1", "v1.36.4");
    kubeconfig_ = node_.Sub("kubeconfig");
    ASSERT_TRUE(WriteFileAtomic(kubeconfig_, absl::StrCat(R"(current-context: node
contexts: [{name: node, context: {cluster: sim, user: agent}}]
clusters: [{name: sim, cluster: {server: ")", api_.url(), R"("}}]
users: [{name: agent, user: {token: node-token}}]
)")).ok());
    ASSERT_TRUE(node_.sim().Start().ok());
    ASSERT_TRUE(node_.sim().Restart(*sim::ParseKubeletVersion("1.36")).ok());
  }

  std::unique_ptr<ChildProcess> SpawnProxy(bool takeover) {
    std::vector<std::string> flags = {"--kubelet_api=dra", absl::StrCat("--dra_driver=", kDriver),
                                      "--node_name=node-1", "--kubeconfig=" + kubeconfig_,
                                      "--cdi_dir=" + node_.Sub("cdi")};
    if (takeover) flags.push_back("--takeover");
    return node_.SpawnProxy(flags);
  }
  // The kubelet registered the driver at `socket` (a registration socket's
  // file name) after the simulator's event `from`.
  bool Registered(const std::string& socket, size_t from) {
    return node_.sim()
        .events()
        .WaitFor(
            [&](const Json& e) {
              return e.value("event", "") == "dra_driver_registered" &&
                     absl::StrContains(e.value("endpoint", ""), socket);
            },
            kWait, from)
        .has_value();
  }
  std::string Registry(const std::string& name) const {
    return node_.Sub("k/plugins_registry/" + name);
  }

  sim::ApiServerSim api_{sim::ApiServerSim::Options{"", "", "node-token", {"v1"}}};
  // The kubelet's API client and the kubelet's DRA manager: a 1.36 node.
  ProcessNode node_{[](sim::KubeletSimOptions& o) {
    const std::string top = o.root_dir.substr(0, o.root_dir.rfind('/'));
    o.kubeconfig = top + "/kubeconfig";
    o.node_name = "node-1";
    o.cdi_dirs = {top + "/cdi"};
  }};
  std::string kubeconfig_;
};

TEST_F(DraDeadInstanceTest, TheNextDpproxyRemovesTheInstanceAKilledOneLeft) {
  std::unique_ptr<ChildProcess> first = SpawnProxy(false);
  ASSERT_NE(first, nullptr);
  std::unique_ptr<ChildProcess> plugin = node_.SpawnPlugin("example.com/gpu", {});
  ASSERT_NE(plugin, nullptr);
  ASSERT_TRUE(Registered("/dra.sock", 0));

  // The takeover: the successor serves generation 1, the first one exits
  // and deletes its registration.
  size_t from = node_.sim().events().Size();
  std::unique_ptr<ChildProcess> second = SpawnProxy(true);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(Registered("/dra-1.sock", from));
  EXPECT_EQ(first->Wait(kWait), 0) << "the first dpproxy did not exit once it handed over";
  ASSERT_TRUE(node_.sim().events().WaitForEvent("dra_instance_removed", {{"driver", kDriver}},
                                                kWait, from));
  EXPECT_EQ(node_.sim().dra_instances(kDriver), 1);

  // Killed: its registration socket stays, and the kubelet keeps it.
  testing::Kill(second.get(), SIGKILL);
  const std::string dead = Registry(absl::StrCat(kDriver, "-reg-1.sock"));
  ASSERT_TRUE(PathExists(dead));
  EXPECT_FALSE(SomeoneListens(dead));

  from = node_.sim().events().Size();
  std::unique_ptr<ChildProcess> third = SpawnProxy(false);
  ASSERT_NE(third, nullptr);
  ASSERT_TRUE(Registered("/dra.sock", from));
  // Removed before the new registration exists, the dead instance was the
  // kubelet's only one: it deregisters the driver, then registers the new.
  EXPECT_TRUE(node_.sim().events().WaitForEvent(
      "dra_driver_deregistered", {{"driver", kDriver}, {"socket", dead}}, kWait, from))
      << "the kubelet still holds the killed dpproxy's instance";
  EXPECT_TRUE(node_.ProxySaid({ProcessNode::Event("dra_dead_instance_removed"), dead}));
  EXPECT_FALSE(PathExists(dead));
  EXPECT_EQ(node_.sim().dra_instances(kDriver), 1);
  EXPECT_EQ(node_.sim().dra_driver(kDriver)->endpoint,
            node_.Sub(absl::StrCat("k/plugins/", kDriver, "/dra.sock")));

  // A live predecessor's registration is never taken for a dead one: the
  // takeover from the third leaves it to the third, which deletes it.
  from = node_.sim().events().Size();
  std::unique_ptr<ChildProcess> fourth = SpawnProxy(true);
  ASSERT_NE(fourth, nullptr);
  ASSERT_TRUE(Registered("/dra-1.sock", from));
  EXPECT_EQ(third->Wait(kWait), 0);
  EXPECT_TRUE(node_.sim().events().WaitForEvent("dra_instance_removed", {{"driver", kDriver}},
                                                kWait, from));
  EXPECT_EQ(node_.sim().dra_instances(kDriver), 1);
  EXPECT_EQ(node_.ProxyLines({ProcessNode::Event("dra_dead_instance_removed")}, 1).size(), 1u)
      << "a live registration was removed as dead";
  testing::Kill(fourth.get(), SIGTERM);
}

}  // namespace
}  // namespace dpproxy
