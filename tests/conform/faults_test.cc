// dpconform against real processes: the sample plugin with each of its
// faults must fail exactly the scenario the fault breaks, on exactly the
// kubelet releases where it matters, with every other cell passing (or not
// applicable, or blocked by that same scenario); and the binary's own
// interface (exit status, JUnit file, --list) holds. (dpproxy in front of
// a plugin: dpproxy_conform_test.)
#include <sys/wait.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/events/event_log.h"
#include "proxy/util/child_process.h"
#include "proxy/util/files.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"
#include "tests/conform/conform_testing.h"
#include "tools/conform/conform.h"

namespace dpproxy::conform {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using testing::DescribeCell;
using testing::SamplePlugin;
using testing::SamplePluginRun;
using testing::kFaultReleases;

struct FaultCase {
  const char* fault;
  const char* flags;     // besides --fault
  const char* scenario;  // the one cell it must fail
  int first_minor;       // it fails on releases first_minor..last_minor
  int last_minor;
};

std::ostream& operator<<(std::ostream& os, const FaultCase& f) { return os << f.fault; }

class FaultTest : public ::testing::TestWithParam<FaultCase> {};

// `scenario` fails on releases first_minor..last_minor; every other cell
// passes, is n/a, or (where the fault matters) is blocked by `scenario`.
void ExpectFailsExactly(const std::vector<CellResult>& cells, const std::string& scenario,
                        int first_minor, int last_minor) {
  int failed = 0;
  for (const CellResult& c : cells) {
    const int minor = std::stoi(c.kubelet.substr(2));
    const bool matters = minor >= first_minor && minor <= last_minor;
    if (c.scenario == scenario && matters) {
      EXPECT_EQ(c.outcome, Outcome::kFail) << DescribeCell(c);
      EXPECT_FALSE(c.plugin_did.empty() || c.kubelet_expects.empty() || c.users_see.empty())
          << DescribeCell(c);
      ++failed;
    } else if (matters) {
      EXPECT_NE(c.outcome, Outcome::kFail) << DescribeCell(c);
      if (c.outcome == Outcome::kBlocked) {
        EXPECT_EQ(c.blocked_by, scenario) << DescribeCell(c);
      }
    } else {
      EXPECT_TRUE(c.outcome == Outcome::kPass || c.outcome == Outcome::kNotApplicable)
          << DescribeCell(c);
    }
  }
  EXPECT_GT(failed, 0);
}

TEST_P(FaultTest, FailsExactlyItsCellWhereItMatters) {
  const FaultCase& f = GetParam();
  const std::string flags = absl::StrCat(f.flags, " --fault=", f.fault);
  ConformOptions o = SamplePluginRun(flags);
  // A fault is judged at the one-second dial its expectations were set
  // for: register-before-serve serves its socket right after its Register,
  // so how long the simulator dials decides whether it is reached.
  o.dial_timeout = absl::Seconds(1);
  // The default scenarios, and the fault's own if it is opt-in (named).
  bool opt_in = false;
  for (const ScenarioInfo& s : Scenarios()) {
    if (!s.opt_in) o.scenarios.push_back(s.name);
    if (s.opt_in && f.scenario == std::string(s.name)) opt_in = true;
  }
  if (opt_in) o.scenarios.push_back(f.scenario);
  // A fault that fails on every release here is checked on the oldest and
  // the newest (either side of 1.25's synchronous registration); one with
  // a boundary on every release, to see the boundary.
  const int oldest = std::stoi(kFaultReleases.front().substr(2));
  const int newest = std::stoi(kFaultReleases.back().substr(2));
  if (f.first_minor <= oldest && f.last_minor >= newest) {
    o.kubelets = {*sim::ParseKubeletVersion(kFaultReleases.front()),
                  *sim::ParseKubeletVersion(kFaultReleases.back())};
  }
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  ASSERT_EQ(cells->size(), o.kubelets.size() * o.scenarios.size());
  ExpectFailsExactly(*cells, f.scenario, f.first_minor, f.last_minor);
}

INSTANTIATE_TEST_SUITE_P(
    SamplePlugin, FaultTest,
    ::testing::Values(
        FaultCase{"wrong-version", "", "registers", 9, 36},
        // 1.10-1.24 dial after Register returns: the plugin is serving by then.
        FaultCase{"register-before-serve", "", "serves-first", 25, 36},
        FaultCase{"no-devices", "", "device-list", 9, 36},
        FaultCase{"stream-per-update", "", "health", 9, 36},
        FaultCase{"no-container-response", "", "allocate", 9, 36},
        FaultCase{"same-device-node", "", "allocate-two", 9, 36},
        // 1.28 reads cdi_devices only with its gate on (off by default).
        FaultCase{"cdi-only", "", "allocate", 9, 28},
        FaultCase{"preferred-wrong-size", "--preferred", "preferred", 19, 36},
        FaultCase{"prestart-fails", "--pre_start_required", "prestart", 10, 36},
        FaultCase{"no-reregister", "", "kubelet-restart", 9, 36},
        FaultCase{"late-wipe-blind", "", "kubelet-crash", 9, 36},
        FaultCase{"unstable-ids", "", "plugin-restart", 9, 36},
        FaultCase{"huge-list", "", "list-size", 9, 36},
        FaultCase{"stale-socket-blocks", "", "allocate-restart", 9, 36},
        FaultCase{"watcher-wrong-type", "--registration=plugin-watcher", "plugin-watcher", 13,
                  36}),
    [](const ::testing::TestParamInfo<FaultCase>& i) {
      std::string n = i.param.fault;
      for (char& ch : n) ch = ch == '-' ? '_' : ch;
      return n;
    });

// The same plugin without faults passes everything that applies, in both
// registration modes; preferred and prestart apply when offered.
TEST(ConformTest, TheSamplePluginPassesEveryRelease) {
  // slow-reserve registers on a new kubelet.sock before it serves its
  // socket again: refused once, it recovers, and kubelet-restart passes.
  for (const char* flags : {"--preferred --pre_start_required --control_node=/dev/sample/ctl",
                            "--registration=plugin-watcher --preferred",
                            "--fault=slow-reserve --preferred --pre_start_required"}) {
    SCOPED_TRACE(flags);
    absl::StatusOr<std::vector<CellResult>> cells = RunConformance(SamplePluginRun(flags));
    ASSERT_TRUE(cells.ok()) << cells.status();
    std::set<std::string> applied;
    for (const CellResult& c : *cells) {
      EXPECT_TRUE(c.outcome == Outcome::kPass || c.outcome == Outcome::kNotApplicable)
          << DescribeCell(c);
      if (c.outcome == Outcome::kPass) applied.insert(c.scenario);
      if (c.scenario == "preferred") {
        EXPECT_EQ(c.outcome == Outcome::kPass, c.kubelet != "1.18") << DescribeCell(c);
      }
    }
    const bool watcher = absl::StrContains(flags, "plugin-watcher");
    EXPECT_EQ(applied.count("plugin-watcher"), watcher ? 1u : 0u);
    EXPECT_EQ(applied.count("prestart"), watcher ? 0u : 1u);
    EXPECT_EQ(applied.count("health"), 1u);
    EXPECT_EQ(applied.count("kubelet-restart"), 1u);
    EXPECT_EQ(applied.count("kubelet-crash"), 0u) << "opt-in: not run unless named";
  }
}

// GPU plugins give every container their control node (an nvidiactl-like
// node) whatever it was allocated; the kubelet never compares device nodes
// across containers. Only a container handed a device it was not given
// fails allocate-two (same-device-node, above).
TEST(ConformTest, AControlNodeEveryContainerGetsIsNotASharedDevice) {
  ConformOptions o = SamplePluginRun("--control_node=/dev/sample/ctl");
  o.kubelets = {*sim::ParseKubeletVersion("1.15"), *sim::ParseKubeletVersion("1.36")};
  o.scenarios = {"allocate-two"};
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  ASSERT_EQ(cells->size(), 2u);
  for (const CellResult& c : *cells) {
    EXPECT_EQ(c.outcome, Outcome::kPass) << DescribeCell(c);
    EXPECT_THAT(c.notes, Contains(HasSubstr("both also get /dev/sample/ctl, which names no "
                                            "device")))
        << DescribeCell(c);
  }
}

// A plugin with one device cannot show that a new pod is admitted beside
// a running one: those cells are n/a, with the reason, never blocked by a
// scenario that passed.
TEST(ConformTest, AOneDevicePluginIsNotApplicableWhereTwoDevicesAreNeeded) {
  ConformOptions o = SamplePluginRun("--devices=1");
  o.kubelets = {*sim::ParseKubeletVersion("1.31")};
  o.scenarios = {"device-list", "plugin-restart", "allocate-two"};
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  for (const CellResult& c : *cells) {
    if (c.scenario == "device-list") {
      EXPECT_EQ(c.outcome, Outcome::kPass) << DescribeCell(c);
    } else {
      EXPECT_EQ(c.outcome, Outcome::kNotApplicable) << DescribeCell(c);
      EXPECT_THAT(c.summary, HasSubstr("the plugin lists 1 device;")) << DescribeCell(c);
    }
  }
}

// Two resources from one process: each on its own socket passes
// multi-resource everywhere; one socket for both fails exactly that cell.
TEST(ConformTest, SeveralResourcesFromOneProcess) {
  ConformOptions o = SamplePluginRun("--resource=example.com/gpu,example.com/fpga");
  o.resources = {"example.com/gpu", "example.com/fpga"};
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  int multi = 0;
  for (const CellResult& c : *cells) {
    EXPECT_TRUE(c.outcome == Outcome::kPass || c.outcome == Outcome::kNotApplicable)
        << DescribeCell(c);
    multi += c.scenario == "multi-resource" && c.outcome == Outcome::kPass;
  }
  EXPECT_EQ(multi, static_cast<int>(kFaultReleases.size()));
  // Two servers binding one path take it from each other (the second
  // unlinks the first's file; the first, seeing its socket gone, serves
  // again), so single-resource cells see streams end too: only the cells
  // that do not depend on that race are asserted here.
  o.plugin_command += " --fault=shared-socket";
  o.scenarios = {"registers", "multi-resource"};
  cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  ExpectFailsExactly(*cells, "multi-resource", 9, 36);
  // Mostly the shared endpoint; when the second server's bind races the
  // kubelet's dial, the second registration fails outright instead; when
  // it races the first server serving again, the bind finds the path
  // taken ("Address already in use"), the plugin exits, and the second
  // resource never registers.
  for (const CellResult& c : *cells) {
    if (c.scenario == "multi-resource") {
      EXPECT_TRUE(absl::StrContains(c.summary, "share the socket") ||
                  absl::StrContains(c.summary, "Register") ||
                  absl::StrContains(c.summary, "not example.com/fpga"))
          << DescribeCell(c);
    }
  }
}

// 1.9 speaks only v1alpha: a v1beta1 plugin fails to register there and
// nowhere else; a v1alpha plugin passes there and fails to register on
// every later release.
TEST(ConformTest, ApiVersionsMeetTheirReleases) {
  ConformOptions o = SamplePluginRun("");
  o.kubelets = {*sim::ParseKubeletVersion("1.9"), *sim::ParseKubeletVersion("1.10")};
  o.scenarios = {"registers", "allocate", "kubelet-restart"};
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  for (const CellResult& c : *cells) {
    if (c.kubelet == "1.9") {
      EXPECT_EQ(c.outcome, c.scenario == "registers" ? Outcome::kFail : Outcome::kBlocked)
          << DescribeCell(c);
    } else {
      EXPECT_EQ(c.outcome, Outcome::kPass) << DescribeCell(c);
    }
  }
  EXPECT_THAT((*cells)[0].summary, HasSubstr("/v1beta1.Registration/Register, which kubelet "
                                             "1.9 does not serve"));
  o.plugin_command += " --api=v1alpha";
  o.health_command.clear();
  cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  for (const CellResult& c : *cells) {
    if (c.kubelet == "1.9") {
      EXPECT_EQ(c.outcome, Outcome::kPass) << DescribeCell(c);
    } else {
      EXPECT_EQ(c.outcome, c.scenario == "registers" ? Outcome::kFail : Outcome::kBlocked)
          << DescribeCell(c);
    }
  }
}

// rolling-update is opt-in: 1.24 stops the replaced client, so a plugin
// with unique socket names passes; 1.31 disconnects by name when the old
// stream ends (kubernetes#121994), so a plain plugin fails; with clients
// tracked per socket (#135437) unique socket names pass. (Instances sharing
// one socket name are left out: the outcome is then each instance's
// reaction to the other replacing and removing the file they share, which
// for the sample plugin, watching its socket, is a race.)
TEST(ConformTest, RollingUpdateFollowsHowTheKubeletTracksClients) {
  struct Case {
    const char* socket_name;
    bool per_socket;
    std::vector<std::pair<std::string, Outcome>> expected;  // release, outcome
  };
  const Case cases[] = {
      {"gpu-{instance}.sock", false, {{"1.24", Outcome::kPass}, {"1.31", Outcome::kFail}}},
      {"gpu-{instance}.sock", true, {{"1.24", Outcome::kPass}, {"1.31", Outcome::kPass}}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(absl::StrCat(k.socket_name, k.per_socket ? ", per socket" : ", by name"));
    ConformOptions o = SamplePluginRun("");
    o.plugin_command = absl::StrCat(SamplePlugin(),
                                    " --quiet --resource=example.com/gpu --devices=2"
                                    " --kubelet_socket={kubelet_socket} --socket_name=",
                                    k.socket_name);
    o.health_command.clear();
    o.scenarios = {"rolling-update"};
    o.kubelets.clear();
    for (const auto& [release, outcome] : k.expected) {
      o.kubelets.push_back(*sim::ParseKubeletVersion(release));
      o.kubelets.back().per_socket_clients = k.per_socket;
    }
    absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
    ASSERT_TRUE(cells.ok()) << cells.status();
    ASSERT_EQ(cells->size(), k.expected.size());
    for (const CellResult& c : *cells) {
      for (const auto& [release, outcome] : k.expected) {
        if (c.kubelet == release) {
          EXPECT_EQ(c.outcome, outcome) << DescribeCell(c);
        }
      }
      if (c.outcome == Outcome::kFail) {
        EXPECT_THAT(c.kubelet_expects, HasSubstr(k.per_socket ? "#135437" : "#121994"))
            << DescribeCell(c);
      }
    }
  }
}

// The binary: exit status, the JUnit file, and what it says of a plugin
// that exits at once.
TEST(ConformTest, TheBinaryReportsAndExits) {
  testing::ShortTempDir dir;
  const std::string junit = dir.Sub("junit.xml");
  ChildSpec spec;
  spec.argv = {testing::Runfile("tools/conform/dpconform"), "--plugin=/bin/true",
               "--resource=example.com/gpu", "--kubelets=1.31",
               "--scenarios=registers,allocate", "--timeout=3s", "--dial_timeout=1s",
               "--output=json", "--junit=" + junit, "--quiet", "--work_dir=" + dir.path()};
  spec.output_path = dir.Sub("out");
  absl::StatusOr<std::unique_ptr<ChildProcess>> c = ChildProcess::Start(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  std::optional<int> status = (*c)->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(ChildProcess::DescribeExit(*status), "exited with status 1");
  Json out = Json::parse(*ReadFile(dir.Sub("out")));
  ASSERT_EQ(out["cells"].size(), 2u);
  EXPECT_EQ(out["cells"][0]["outcome"], "fail");
  EXPECT_THAT(out["cells"][0]["plugin_did"].get<std::string>(),
              HasSubstr("the plugin exited with status 0"));
  EXPECT_EQ(out["cells"][1]["outcome"], "blocked");
  absl::StatusOr<std::string> xml = ReadFile(junit);
  ASSERT_TRUE(xml.ok());
  // The blocked cell is a failure too, with its reason.
  EXPECT_THAT(*xml, HasSubstr("tests=\"2\" failures=\"2\""));
  EXPECT_THAT(*xml, HasSubstr("type=\"blocked\">not run: it needs"));
  // The failed cell's directory is kept and named.
  EXPECT_TRUE(PathExists(out["cells"][0]["dir"].get<std::string>() + "/plugin.log"));

  spec.argv = {testing::Runfile("tools/conform/dpconform"), "--plugin=p {sockets}",
               "--resource=example.com/gpu"};
  c = ChildProcess::Start(spec);
  ASSERT_TRUE(c.ok());
  status = (*c)->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(ChildProcess::DescribeExit(*status), "exited with status 2");
  EXPECT_THAT(*ReadFile(dir.Sub("out")), HasSubstr("--plugin: unknown placeholder {sockets}"));

  spec.argv = {testing::Runfile("tools/conform/dpconform"), "--list"};
  c = ChildProcess::Start(spec);
  ASSERT_TRUE(c.ok());
  status = (*c)->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0);
  const std::string list = *ReadFile(dir.Sub("out"));
  EXPECT_THAT(list, HasSubstr("1.25-1.27"));
  EXPECT_THAT(list, HasSubstr("kubelet-crash"));
  EXPECT_THAT(list, HasSubstr("{kubelet_socket}"));
}

}  // namespace
}  // namespace dpproxy::conform
