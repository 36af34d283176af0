// dpconform against dpproxy: a v1alpha plugin behind it passes every
// kubelet generation, and the opt-in checkpoint-lost scenario and
// list-growth, which a plain plugin fails.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/conform/conform_testing.h"
#include "tests/testing/process.h"
#include "tools/conform/conform.h"

namespace dpproxy::conform {
namespace {

using ::testing::HasSubstr;
using testing::DescribeCell;
using testing::SamplePlugin;
using testing::SamplePluginRun;

// What dpproxy is for: a v1alpha plugin behind it passes every generation.
TEST(ConformTest, DpproxyWithALegacyPluginPassesEveryGeneration) {
  ConformOptions o = SamplePluginRun("");
  const std::string dpproxy = testing::Runfile("proxy/dpproxy");
  o.plugin_command = absl::StrCat(
      dpproxy,
      " --kubelet_root={kubelet_root} --plugin_dir={work_dir}/p --state_dir={work_dir}/s"
      " --status_file={work_dir}/status.json --metrics_address= 2>>{work_dir}/dpproxy.log & ",
      "exec ", SamplePlugin(),
      " --quiet --api=v1alpha --resource=example.com/gpu --devices=4"
      " --kubelet_socket={work_dir}/p/kubelet.sock --control_socket={work_dir}/control.sock");
  o.kubelets.clear();
  for (const std::string& k : DefaultKubelets()) o.kubelets.push_back(*sim::ParseKubeletVersion(k));
  // dpproxy tries v1beta1 first, then v1alpha (slower under sanitizers).
  o.settle = absl::Seconds(10);
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  std::map<std::string, int> passed;
  for (const CellResult& c : *cells) {
    EXPECT_TRUE(c.outcome == Outcome::kPass || c.outcome == Outcome::kNotApplicable)
        << DescribeCell(c);
    passed[c.kubelet] += c.outcome == Outcome::kPass;
  }
  // Every default scenario but plugin-watcher, prestart and multi-resource
  // applies to a v1alpha plugin behind dpproxy; preferred too where the
  // kubelet calls it (1.19+), since dpproxy answers it for every plugin.
  for (const std::string& k : DefaultKubelets()) {
    const int minor = sim::ParseKubeletVersion(k)->minor;
    EXPECT_EQ(passed[k], minor >= 19 ? 11 : 10) << k;
  }
}

// dpproxy with a state directory, and the sample plugin of `flags` behind
// it once dpproxy serves its registration socket.
std::string BehindDpproxy(const std::string& flags) {
  return absl::StrCat(testing::Runfile("proxy/dpproxy"),
                      " --kubelet_root={kubelet_root} --plugin_dir={work_dir}/p"
                      " --state_dir={work_dir}/s --status_file= --metrics_address="
                      " 2>>{work_dir}/dpproxy.log & ",
                      testing::Runfile("proxy/dpproxy"),
                      " wait --plugin_dir={work_dir}/p && exec ", SamplePlugin(),
                      " --quiet --resource=example.com/gpu"
                      " --kubelet_socket={work_dir}/p/kubelet.sock ", flags);
}

// checkpoint-lost is opt-in: a plain plugin fails it on 1.25+ (the kubelet
// forgets the running pod's device and a new pod gets it); dpproxy with a
// state directory in front of the same plugin passes it (it steers new
// pods away from the device and refuses it to them), on those releases and
// on 1.24, whose re-admission allocates again for the running pod.
TEST(ConformTest, CheckpointLostFailsAPlainPluginAndPassesBehindDpproxy) {
  ConformOptions plain = SamplePluginRun("--devices=2");
  plain.kubelets = {*sim::ParseKubeletVersion("1.31"), *sim::ParseKubeletVersion("1.36")};
  plain.scenarios = {"checkpoint-lost"};
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(plain);
  ASSERT_TRUE(cells.ok()) << cells.status();
  ASSERT_EQ(cells->size(), 2u);
  for (const CellResult& c : *cells) {
    EXPECT_EQ(c.outcome, Outcome::kFail) << DescribeCell(c);
    EXPECT_THAT(c.summary, HasSubstr("handed to a new pod")) << DescribeCell(c);
  }

  ConformOptions behind = plain;
  behind.plugin_command = BehindDpproxy("--api=v1alpha --devices=2");
  behind.settle = absl::Seconds(10);
  behind.kubelets.push_back(*sim::ParseKubeletVersion("1.24"));
  cells = RunConformance(behind);
  ASSERT_TRUE(cells.ok()) << cells.status();
  ASSERT_EQ(cells->size(), 3u);
  for (const CellResult& c : *cells) EXPECT_EQ(c.outcome, Outcome::kPass) << DescribeCell(c);
}

// list-growth: a plain plugin whose list grows past 4 MiB loses its
// stream (RESOURCE_EXHAUSTED) and stays lost; behind dpproxy the same
// plugin passes, dpproxy shortening its long IDs by itself (no pod holds a
// device) so that every device reaches the kubelet.
TEST(ConformTest, AListGrowingPast4MiBFailsAPlainPluginAndPassesBehindDpproxy) {
  const std::string grow = absl::StrCat(SamplePlugin(),
                                        " set-devices --control_socket={work_dir}/control.sock"
                                        " --count={count} >/dev/null");
  ConformOptions plain = SamplePluginRun("--id_pattern='{'uuid'}'");
  plain.grow_command = grow;
  plain.kubelets = {*sim::ParseKubeletVersion("1.24"), *sim::ParseKubeletVersion("1.37")};
  plain.scenarios = {"list-growth"};
  plain.timeout = absl::Seconds(10);
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(plain);
  ASSERT_TRUE(cells.ok()) << cells.status();
  ASSERT_EQ(cells->size(), 2u);
  for (const CellResult& c : *cells) {
    EXPECT_EQ(c.outcome, Outcome::kFail) << DescribeCell(c);
    EXPECT_THAT(c.summary, HasSubstr("ended the kubelet's stream")) << DescribeCell(c);
    EXPECT_THAT(c.plugin_did, HasSubstr("RESOURCE_EXHAUSTED")) << DescribeCell(c);
    EXPECT_THAT(c.notes, ::testing::Contains(HasSubstr("reached the kubelet on the same stream")))
        << DescribeCell(c);
  }

  ConformOptions behind = plain;
  behind.plugin_command =
      BehindDpproxy("--id_pattern='{'uuid'}' --control_socket={work_dir}/control.sock");
  behind.timeout = absl::Seconds(30);
  behind.settle = absl::Seconds(10);
  cells = RunConformance(behind);
  ASSERT_TRUE(cells.ok()) << cells.status();
  ASSERT_EQ(cells->size(), 2u);
  for (const CellResult& c : *cells) {
    EXPECT_EQ(c.outcome, Outcome::kPass) << DescribeCell(c);
    EXPECT_THAT(c.summary, HasSubstr("devices reached the kubelet")) << DescribeCell(c);
  }
}

}  // namespace
}  // namespace dpproxy::conform
