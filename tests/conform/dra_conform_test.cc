// dpconform's DRA mode against real processes: dpproxy in DRA mode with a
// legacy v1alpha plugin behind it passes every DRA scenario on 1.32
// (v1beta1.DRAPlugin), 1.34 (v1.DRAPlugin) and 1.37; drivers that get one thing
// wrong fail exactly the scenario it breaks, the cells that need it
// blocked by it, naming what they did.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"
#include "tools/conform/conform.h"
#include "tools/conform/dra.h"

namespace dpproxy::conform {
namespace {

using ::testing::HasSubstr;

constexpr char kDriver[] = "gpu.example.com";

// dpproxy in DRA mode as `driver`, with a sample plugin of `api` behind it.
// The kit keeps the directories of cells that fail (by design, for a
// person to look at), and these tests make cells fail: they go in a
// directory of this test's own, removed when it ends, not in /tmp.
const std::string& WorkRoot() {
  static const testing::ShortTempDir dir;
  return dir.path();
}

ConformOptions Options(const std::string& driver, const std::string& plugin_flags,
                       const std::string& dpproxy_flags = "") {
  ConformOptions o;
  o.work_root = WorkRoot();
  o.dra_driver = kDriver;
  o.plugin_command = absl::StrCat(
      testing::Runfile("proxy/dpproxy"), " --kubelet_api=dra --dra_driver=", driver,
      " --node_name={node_name} --kubeconfig={kubeconfig} --cdi_dir={cdi_dir}"
      " --kubelet_root={kubelet_root} --plugin_dir={work_dir}/p --state_dir={work_dir}/s"
      " --metrics_address= ",
      dpproxy_flags, " 2>>{work_dir}/dpproxy.log & exec ",
      testing::Runfile("tools/sample_plugin/sample_plugin"),
      " --quiet --resource=example.com/gpu --devices=4 --kubelet_socket={work_dir}/p/kubelet.sock ",
      plugin_flags);
  for (const std::string& k : DefaultDraKubelets()) {
    o.kubelets.push_back(*sim::ParseKubeletVersion(k));
  }
  o.timeout = absl::Seconds(10);
  o.dial_timeout = absl::Seconds(1);
  o.jobs = 4;
  return o;
}

// scenario -> outcomes on each release, e.g. "pass pass".
std::map<std::string, std::string> Outcomes(const std::vector<CellResult>& cells) {
  std::map<std::string, std::string> out;
  for (const CellResult& c : cells) {
    std::string& s = out[c.scenario];
    absl::StrAppend(&s, s.empty() ? "" : " ", OutcomeName(c.outcome),
                    c.blocked_by.empty() ? "" : absl::StrCat(":", c.blocked_by));
  }
  return out;
}

const CellResult* Find(const std::vector<CellResult>& cells, const std::string& scenario) {
  for (const CellResult& c : cells) {
    if (c.scenario == scenario) return &c;
  }
  return nullptr;
}

// A dpproxy configuration that serves example.com/gpu both ways: as the
// DRA driver's pool and as a device plugin's extended resource.
std::string BothWaysConfig() {
  const std::string path = JoinPath(WorkRoot(), "both.yaml");
  EXPECT_TRUE(WriteFileAtomic(path, "paths:\n  example.com/gpu: both\n").ok());
  return path;
}

TEST(DraConformTest, DpproxyWithALegacyPluginPassesEveryScenario) {
  // Both ways, so that the scenarios of a device plugin beside the driver
  // apply too.
  ConformOptions o = Options(kDriver, "--api=v1alpha", "--config=" + BothWaysConfig());
  o.resources = {"example.com/gpu"};
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  EXPECT_EQ(cells->size(), 3 * DraScenarios().size());
  for (const auto& [scenario, outcomes] : Outcomes(*cells)) {
    // Kubelets watch device health from 1.36: 1.37 of 1.32, 1.34, 1.37.
    EXPECT_EQ(outcomes, scenario == "dra-health" ? "n/a n/a pass" : "pass pass pass")
        << scenario;
  }
  // 1.37 watches the v1 stream dpproxy lists first, and it names the
  // published devices.
  const CellResult* health = nullptr;
  for (const CellResult& c : *cells) {
    if (c.scenario == "dra-health" && c.outcome == Outcome::kPass) health = &c;
  }
  ASSERT_NE(health, nullptr);
  EXPECT_THAT(health->summary, HasSubstr("device(s) reported on v1.DRAResourceHealth"));
  const CellResult* reg = Find(*cells, "dra-registers");
  ASSERT_NE(reg, nullptr);
  EXPECT_THAT(reg->summary, HasSubstr("v1beta1.DRAPlugin"));  // 1.32 comes first
}

TEST(DraConformTest, ADriverOfAnotherNameFailsRegistrationAndBlocksTheRest) {
  ConformOptions o = Options("other.example.com", "--api=v1alpha");
  o.kubelets.resize(1);
  o.timeout = absl::Seconds(3);
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  const std::map<std::string, std::string> got = Outcomes(*cells);
  EXPECT_EQ(got.at("dra-registers"), "fail");
  EXPECT_EQ(got.at("dra-prepare"), "blocked:dra-registers");
  EXPECT_EQ(got.at("dra-kubelet-restart"), "blocked:dra-registers");
  EXPECT_EQ(got.at("dra-unknown-claim"), "blocked:dra-registers");
  EXPECT_EQ(got.at("dra-publishes"), "fail");  // its slices name the other driver
  const CellResult* reg = Find(*cells, "dra-registers");
  EXPECT_THAT(reg->plugin_did, HasSubstr("no DRAPlugin named gpu.example.com appeared"));
  EXPECT_THAT(reg->users_see, HasSubstr("ContainerCreating"));
}

TEST(DraConformTest, CdiNamesNoSpecDefinesFailPrepare) {
  // A v1beta1 plugin that answers CDI names without writing their spec:
  // the runtime could not create the container.
  ConformOptions o = Options(kDriver, "--api=v1beta1");
  o.kubelets.resize(1);
  o.scenarios = {"dra-publishes", "dra-prepare", "dra-kubelet-restart"};
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  const std::map<std::string, std::string> got = Outcomes(*cells);
  EXPECT_EQ(got.at("dra-publishes"), "pass");
  EXPECT_EQ(got.at("dra-prepare"), "fail");
  EXPECT_EQ(got.at("dra-kubelet-restart"), "blocked:dra-prepare");
  const CellResult* prepare = Find(*cells, "dra-prepare");
  EXPECT_THAT(prepare->plugin_did, HasSubstr("unresolvable CDI device example.com/gpu=dev-"));
  EXPECT_THAT(prepare->users_see, HasSubstr("CreateContainerError"));
  // The same plugin writing its spec passes.
  o.plugin_command += " --cdi_dir={cdi_dir}";
  cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  for (const auto& [scenario, outcome] : Outcomes(*cells)) EXPECT_EQ(outcome, "pass") << scenario;
}

// A device plugin and a separate DRA driver for the same devices (each a
// sample plugin; the driver dpproxy in DRA mode only): each hands out what
// the other holds, and both scenarios fail naming the shared device node.
// Without --resource they do not apply.
TEST(DraConformTest, APluginAndADriverThatShareDevicesFailBesideEachOther) {
  ConformOptions o = Options(kDriver, "--cdi_dir={cdi_dir}");
  o.plugin_command = absl::StrCat(testing::Runfile("tools/sample_plugin/sample_plugin"),
                                  " --quiet --resource=example.com/gpu --devices=4"
                                  " --cdi_dir={cdi_dir} --kubelet_socket={kubelet_socket} & ",
                                  o.plugin_command);
  o.resources = {"example.com/gpu"};
  o.kubelets.resize(1);
  o.scenarios = {"dra-beside-device-plugin", "dra-device-plugin-beside-claim"};
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  const std::map<std::string, std::string> got = Outcomes(*cells);
  EXPECT_EQ(got.at("dra-beside-device-plugin"), "fail");
  EXPECT_EQ(got.at("dra-device-plugin-beside-claim"), "fail");
  EXPECT_THAT(Find(*cells, "dra-beside-device-plugin")->summary,
              HasSubstr("which a device-plugin pod holds"));
  EXPECT_THAT(Find(*cells, "dra-device-plugin-beside-claim")->summary,
              HasSubstr("which a prepared claim holds"));
  EXPECT_THAT(Find(*cells, "dra-device-plugin-beside-claim")->users_see,
              HasSubstr("two pods use one device at once"));
  o.resources.clear();
  cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  for (const auto& [scenario, outcome] : Outcomes(*cells)) EXPECT_EQ(outcome, "n/a") << scenario;
}

TEST(DraConformTest, BadOptionsAreNamed) {
  ConformOptions o = Options(kDriver, "");
  o.kubelets = {*sim::ParseKubeletVersion("1.31")};
  EXPECT_THAT(std::string(ValidateOptions(o).message()), HasSubstr("kubelet 1.31 has no DRA"));
  o = Options(kDriver, "");
  o.scenarios = {"allocate"};
  EXPECT_THAT(std::string(ValidateOptions(o).message()),
              HasSubstr("unknown DRA scenario \"allocate\""));
  o = Options(kDriver, "--id_pattern=x-{instance}");
  EXPECT_THAT(std::string(ValidateOptions(o).message()), HasSubstr("unknown placeholder {instance}"));
}

}  // namespace
}  // namespace dpproxy::conform
