#include "tools/conform/report.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/events/event_log.h"
#include "proxy/util/files.h"
#include "proxy/version/version.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"
#include "tools/conform/conform.h"
#include "tools/apiserver_sim/apiserver_sim.h"
#include "tools/conform/dra.h"
#include "tools/conform/real.h"

namespace dpproxy::conform {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<CellResult> Cells() {
  CellResult pass;
  pass.kubelet = "1.24";
  pass.generation = "1.19-1.24";
  pass.scenario = "registers";
  pass.summary = "registered";
  pass.notes = {"version \"v1beta1\""};
  pass.duration = absl::Milliseconds(120);
  CellResult fail = pass;
  fail.kubelet = "1.31";
  fail.generation = "1.31-1.36";
  fail.outcome = Outcome::kFail;
  fail.summary = "answered <nothing> & \"quoted\"";
  fail.plugin_did = "sent no container response";
  fail.kubelet_expects = "one per request";
  fail.users_see = "UnexpectedAdmissionError";
  fail.notes.clear();
  fail.dir = "/tmp/dpconform.x/c1";
  CellResult blocked = fail;
  blocked.scenario = "allocate";
  blocked.outcome = Outcome::kBlocked;
  blocked.blocked_by = "registers";
  blocked.summary = "not reached: registers failed";
  blocked.plugin_did = blocked.kubelet_expects = blocked.users_see = "";
  blocked.dir.clear();
  CellResult na = pass;
  na.scenario = "allocate";
  na.outcome = Outcome::kNotApplicable;
  na.summary = "never called";
  na.notes.clear();
  return {pass, na, fail, blocked};
}

TEST(ReportTest, TableHasAColumnPerReleaseARowPerScenarioAndExplainsFailures) {
  const std::string t = RenderTable(Cells());
  EXPECT_THAT(t, HasSubstr("scenario   1.24     1.31"));
  EXPECT_THAT(t, HasSubstr("registers  pass     FAIL"));
  EXPECT_THAT(t, HasSubstr("allocate   n/a      blocked"));
  EXPECT_THAT(t, HasSubstr("registers on kubelet 1.31 (1.31-1.36): answered <nothing>"));
  EXPECT_THAT(t, HasSubstr("  plugin did: sent no container response\n"));
  EXPECT_THAT(t, HasSubstr("  kubelet 1.31 expects: one per request\n"));
  EXPECT_THAT(t, HasSubstr("  users see: UnexpectedAdmissionError\n"));
  EXPECT_THAT(t, HasSubstr("  files: /tmp/dpconform.x/c1\n"));
  EXPECT_THAT(t, HasSubstr("4 cells: 1 passed, 1 failed, 1 blocked, 1 not applicable"));
}

// A device ID of one control character (as some plugins name devices)
// reaches the text report escaped, never raw.
TEST(ReportTest, ControlCharactersAreEscapedInTheTable) {
  std::vector<CellResult> cells = Cells();
  cells[2].summary = std::string("the running pod's device \x01 is gone");
  cells[2].plugin_did = std::string("listed [\x00, \x02]", 13);
  const std::string text = RenderTable(cells);
  EXPECT_THAT(text, HasSubstr("the running pod's device \\x01 is gone"));
  EXPECT_THAT(text, HasSubstr("listed [\\x00, \\x02]"));
  for (char ch : text) EXPECT_TRUE(ch == '\n' || static_cast<unsigned char>(ch) >= 0x20) << text;
}

TEST(ReportTest, JsonCarriesEveryCellAndTotals) {
  ConformOptions o;
  o.plugin_command = "p";
  o.resources = {"example.com/gpu"};
  Json j = Json::parse(RenderJson(o, Cells()));
  EXPECT_EQ(j["kubelets"], Json({"1.24", "1.31"}));
  EXPECT_EQ(j["scenarios"], Json({"registers", "allocate"}));
  ASSERT_EQ(j["cells"].size(), 4u);
  EXPECT_EQ(j["cells"][2]["outcome"], "fail");
  EXPECT_EQ(j["cells"][2]["users_see"], "UnexpectedAdmissionError");
  EXPECT_EQ(j["cells"][3]["blocked_by"], "registers");
  EXPECT_FALSE(j["cells"][0].contains("blocked_by"));
  EXPECT_DOUBLE_EQ(j["cells"][0]["seconds"].get<double>(), 0.12);
  EXPECT_EQ(j["totals"]["failed"], 1);
  EXPECT_EQ(j["totals"]["not_applicable"], 1);
}

ConformOptions JUnitOptions() {
  ConformOptions o;
  o.plugin_command = "/opt/vendor/plugin --socket={kubelet_socket} & \"x\"";
  return o;
}

// A CI page shows blocked cells red, with their reason (dpconform counts
// them as failures), and n/a cells as skipped with theirs.
TEST(ReportTest, JUnitCountsBlockedAsFailuresAndEscapes) {
  const std::string x = RenderJUnit(JUnitOptions(), Cells());
  EXPECT_THAT(x, HasSubstr("<testsuites name=\"dpconform\" tests=\"4\" failures=\"2\" "
                           "errors=\"0\" time="));
  EXPECT_THAT(x, HasSubstr("<testsuite name=\"kubelet 1.24 (1.19-1.24)\" tests=\"2\" "
                           "failures=\"0\" errors=\"0\" skipped=\"1\""));
  EXPECT_THAT(x, HasSubstr("<testsuite name=\"kubelet 1.31 (1.31-1.36)\" tests=\"2\" "
                           "failures=\"2\" errors=\"0\" skipped=\"0\""));
  EXPECT_THAT(x, HasSubstr("<failure message=\"answered &lt;nothing&gt; &amp; "
                           "&quot;quoted&quot;\" type=\"conformance\">"));
  EXPECT_THAT(x, HasSubstr("<failure message=\"blocked: not reached: registers failed\" "
                           "type=\"blocked\">not run: it needs registers, which failed on "
                           "this release</failure>"));
  EXPECT_THAT(x, HasSubstr("<skipped message=\"not applicable: never called\"/>"));
  EXPECT_THAT(x, HasSubstr("<system-out>version &quot;v1beta1&quot;</system-out>"));
  EXPECT_THAT(x, HasSubstr("<property name=\"plugin\" value=\"/opt/vendor/plugin "
                           "--socket={kubelet_socket} &amp; &quot;x&quot;\"/>"));
  EXPECT_THAT(x, HasSubstr("<property name=\"kubelet\" value=\"1.31\"/>"));
  EXPECT_THAT(x, HasSubstr(absl::StrCat("<property name=\"dpconform_version\" value=\"",
                                        kDpproxyVersion, "\"/>")));
  EXPECT_THAT(x, Not(HasSubstr("<nothing>")));
}

// The schema written from the JUnit format's documented elements
// (tests/conform/junit.xsd), checked by libxml2's validator.
TEST(ReportTest, JUnitIsValidAgainstTheSchema) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/report.xml");
  ASSERT_TRUE(WriteFileAtomic(path, RenderJUnit(JUnitOptions(), Cells())).ok());
  const std::string schema = testing::Runfile("tests/conform/junit.xsd");
  auto validate = [&](const std::string& file) {
    const std::string cmd = absl::StrCat("xmllint --noout --schema '", schema, "' '", file,
                                         "' 2>&1");
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[512];
    while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    const int status = p == nullptr ? -1 : ::pclose(p);
    return std::make_pair(status, out);
  };
  auto [status, out] = validate(path);
  EXPECT_EQ(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("validates"));
  // The validator does refuse what the schema leaves out: a skipped count
  // on <testsuites>, which the common schema has not.
  const std::string bad = absl::StrCat(::testing::TempDir(), "/bad.xml");
  ASSERT_TRUE(WriteFileAtomic(bad, "<testsuites skipped=\"1\"></testsuites>").ok());
  auto [bad_status, bad_out] = validate(bad);
  EXPECT_NE(bad_status, 0) << bad_out;
  EXPECT_THAT(bad_out, HasSubstr("skipped"));
}

// --kubelets=all would be a column per release, far wider than a terminal:
// releases of one generation share a column, within 120 characters.
TEST(ReportTest, ATableOfManyReleasesGroupsThemByGeneration) {
  std::vector<CellResult> cells;
  const std::vector<std::pair<std::string, std::string>> releases = {
      {"1.10", "1.10-1.24"}, {"1.11", "1.10-1.24"}, {"1.12", "1.10-1.24"},
      {"1.13", "1.10-1.24"}, {"1.14", "1.10-1.24"}, {"1.15", "1.10-1.24"},
      {"1.16", "1.10-1.24"}, {"1.17", "1.10-1.24"}, {"1.18", "1.10-1.24"},
      {"1.19", "1.10-1.24"}, {"1.24", "1.10-1.24"}, {"1.25", "1.25-1.36"},
      {"1.26", "1.25-1.36"}, {"1.27", "1.25-1.36"}, {"1.36", "1.25-1.36"}};
  for (const auto& [k, g] : releases) {
    for (const char* s : {"registers", "serves-first"}) {
      CellResult c;
      c.kubelet = k;
      c.generation = g;
      c.scenario = s;
      c.outcome = std::string(s) == "serves-first" && k == "1.36" ? Outcome::kFail
                                                                   : Outcome::kPass;
      c.summary = "x";
      cells.push_back(c);
    }
  }
  const std::string t = RenderTable(cells);
  EXPECT_THAT(t, HasSubstr("scenario      1.10-1.24  1.25-1.36\n"));
  EXPECT_THAT(t, HasSubstr("registers     pass       pass     \n"));
  EXPECT_THAT(t, HasSubstr("serves-first  pass       pass/FAIL\n"));
  EXPECT_THAT(t, HasSubstr("serves-first on kubelet 1.36 (1.25-1.36): x"));
  for (absl::string_view line : absl::StrSplit(t, '\n')) {
    EXPECT_LE(line.size(), 120u) << line;
  }
}

// A CI job's summary: a row per release, the failed and blocked cells
// with what they mean, and nothing that breaks the table.
TEST(ReportTest, MarkdownHasARowPerReleaseAndListsFailures) {
  const std::string m = RenderMarkdown(JUnitOptions(), Cells());
  EXPECT_THAT(m, HasSubstr("4 cells: 1 passed, 1 failed, 1 blocked, 1 not applicable"));
  EXPECT_THAT(m, HasSubstr("| kubelet | registers | allocate |\n|---|---|---|\n"));
  EXPECT_THAT(m, HasSubstr("| 1.24 (1.19-1.24) | pass | n/a |\n"));
  EXPECT_THAT(m, HasSubstr("| 1.31 (1.31-1.36) | **FAIL** | blocked |\n"));
  EXPECT_THAT(m, HasSubstr("- **registers on 1.31** (failed): answered \\<nothing\\> & "
                           "\"quoted\"\n"));
  EXPECT_THAT(m, HasSubstr("  - users see: UnexpectedAdmissionError\n"));
  EXPECT_THAT(m, HasSubstr("- **allocate on 1.31** (blocked): not reached: registers failed\n"));
  EXPECT_THAT(m, Not(HasSubstr("<nothing>")));
}

// One HTML file a CI keeps as an artifact: the grid in colour, every link
// to a failure's text lands on it, the text is escaped, the kept directory
// is named, and nothing is fetched or run.
TEST(ReportTest, HtmlIsOneSelfContainedFileWithEveryFailureLinked) {
  const std::string h = RenderHtml(JUnitOptions(), Cells());
  EXPECT_THAT(h, HasSubstr("4 cells: 1 passed, 1 failed, 1 blocked, 1 not applicable"));
  // The header row and one row per release.
  int rows = 0;
  for (size_t at = h.find("<tr>"); at != std::string::npos; at = h.find("<tr>", at + 1)) ++rows;
  EXPECT_EQ(rows, 3);
  EXPECT_THAT(h, HasSubstr("<th class=\"k\">1.31 (1.31-1.36)</th><td class=\"fail\""));
  EXPECT_THAT(h, HasSubstr("<td class=\"na\" title=\"never called"));
  // Every link from the grid has its target.
  int links = 0;
  for (size_t at = h.find("href=\"#"); at != std::string::npos; at = h.find("href=\"#", at + 1)) {
    const size_t from = at + 7;
    const std::string id = h.substr(from, h.find('"', from) - from);
    EXPECT_THAT(h, HasSubstr(absl::StrCat("<li id=\"", id, "\">"))) << id;
    ++links;
  }
  EXPECT_EQ(links, 2);  // the failed and the blocked cell
  EXPECT_THAT(h, HasSubstr("answered &lt;nothing&gt; &amp; &quot;quoted&quot;"));
  EXPECT_THAT(h, Not(HasSubstr("<nothing>")));
  EXPECT_THAT(h, HasSubstr("users see: UnexpectedAdmissionError"));
  EXPECT_THAT(h, HasSubstr("kept in <code>/tmp/dpconform.x/c1</code>"));
  EXPECT_THAT(h, Not(HasSubstr("<script")));
  EXPECT_THAT(h, Not(HasSubstr("src=")));
  EXPECT_THAT(h, Not(HasSubstr("http")));
  // Line breaks stay line breaks; other control characters are named.
  EXPECT_THAT(h, Not(HasSubstr("\\x0a")));
}

// A plugin's text with line breaks and a NUL: the HTML keeps the breaks,
// and no output carries a raw control character.
TEST(ReportTest, ControlCharactersAreNamedAndLineBreaksKept) {
  std::vector<CellResult> cells = Cells();
  cells[1].summary = std::string("device \"a\0b\" refused\nsecond line", 32);
  const std::string h = RenderHtml(JUnitOptions(), cells);
  EXPECT_THAT(h, HasSubstr("device &quot;a\\x00b&quot; refused\nsecond line"));
  EXPECT_EQ(h.find('\0'), std::string::npos);
  EXPECT_EQ(Printable(std::string("a\0b\n", 4)), "a\\x00b\\x0a");
}

// A cell is blocked only by a scenario that failed in the same release;
// otherwise the failed check is the cell's own failure, and says why.
TEST(SettleBlockedTest, OnlyAFailureInTheSameReleaseBlocks) {
  CellResult device_list;
  device_list.kubelet = "1.31";
  device_list.scenario = "device-list";
  device_list.outcome = Outcome::kPass;
  CellResult held = device_list;
  held.scenario = "plugin-restart";
  held.outcome = Outcome::kBlocked;
  held.blocked_by = "device-list";
  held.summary = "not reached: device-list failed (no device list within 30s)";
  CellResult failed_elsewhere = device_list;
  failed_elsewhere.kubelet = "1.24";
  failed_elsewhere.outcome = Outcome::kFail;
  CellResult blocked_there = held;
  blocked_there.kubelet = "1.24";
  CellResult not_run = held;
  not_run.blocked_by = "registers";
  std::vector<CellResult> cells = {device_list, held, failed_elsewhere, blocked_there, not_run};
  SettleBlocked(&cells);
  EXPECT_EQ(cells[1].outcome, Outcome::kFail);
  EXPECT_TRUE(cells[1].blocked_by.empty());
  EXPECT_THAT(cells[1].summary,
              HasSubstr("device-list itself was pass in kubelet 1.31, so this is this cell's "
                        "own failure"));
  EXPECT_EQ(cells[3].outcome, Outcome::kBlocked);  // device-list failed in 1.24
  EXPECT_EQ(cells[3].blocked_by, "device-list");
  EXPECT_EQ(cells[4].outcome, Outcome::kFail);
  EXPECT_THAT(cells[4].summary, HasSubstr("registers was not run"));
  const Totals t = Count(cells);
  EXPECT_EQ(t.failed, 3);
  EXPECT_EQ(t.blocked, 1);
}

TEST(ExpandTest, ReplacesKnownPlaceholdersKeepsShellBracesAndNamesUnknownOnes) {
  std::vector<std::pair<std::string, std::string>> v = {{"plugin_dir", "/d"},
                                                        {"resource", "x.com/y"}};
  EXPECT_EQ(*Expand("p --dir={plugin_dir} -r {resource} ${HOME} {}", v),
            "p --dir=/d -r x.com/y ${HOME} {}");
  absl::StatusOr<std::string> bad = Expand("p {kubelet_sock}", v);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("unknown placeholder {kubelet_sock}; known: {plugin_dir} {resource}"));
}

TEST(ValidateTest, NamesTheFlagAtFault) {
  ConformOptions o;
  o.plugin_command = "p";
  o.resources = {"example.com/gpu"};
  o.kubelets = {*sim::ParseKubeletVersion("1.31")};
  EXPECT_TRUE(ValidateOptions(o).ok());
  auto message = [](ConformOptions c) { return std::string(ValidateOptions(c).message()); };
  ConformOptions c = o;
  c.plugin_command = "";
  EXPECT_THAT(message(c), HasSubstr("--plugin"));
  c = o;
  c.plugin_command = "p {socket}";
  EXPECT_THAT(message(c), HasSubstr("--plugin: unknown placeholder {socket}"));
  c = o;
  c.health_command = "h {device} {state}";
  EXPECT_THAT(message(c), HasSubstr("--health_command: unknown placeholder {state}"));
  c = o;
  c.scenarios = {"allocate", "alocate"};
  EXPECT_THAT(message(c), HasSubstr("unknown scenario \"alocate\""));
  c = o;
  c.resources.clear();
  EXPECT_THAT(message(c), HasSubstr("--resource"));
  c = o;
  c.timeout = absl::Seconds(5);
  EXPECT_THAT(message(c), HasSubstr("--timeout=5s is too short"));
  c = o;
  c.work_root = "/tmp/" + std::string(60, 'w');
  EXPECT_THAT(message(c), HasSubstr("107-byte"));
  c = o;
  c.jobs = 0;
  EXPECT_THAT(message(c), HasSubstr("--jobs=0"));
}

TEST(RealKubeletTest, NamesParseAsRealOrNot) {
  EXPECT_EQ(**ParseRealKubelet("real:1.37"), "1.37");
  EXPECT_EQ(**ParseRealKubelet("real"), "");
  EXPECT_FALSE(ParseRealKubelet("1.37")->has_value());
  for (const char* bad : {"real:", "real:37", "real:2.1", "real:1.x", "real:latest"}) {
    absl::StatusOr<std::optional<std::string>> r = ParseRealKubelet(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("real:1.MINOR")) << bad;
  }
}

TEST(RealKubeletTest, OptionsNameWhatTheNodeNeeds) {
  ConformOptions o;
  o.plugin_command = "p";
  o.resources = {"example.com/gpu"};
  o.real_kubelets = {"1.37"};
  o.real.kubeconfig = "/etc/kubeconfig";
  o.real.pod_image = "busybox";
  EXPECT_TRUE(ValidateOptions(o).ok()) << ValidateOptions(o);
  auto message = [](ConformOptions c) { return std::string(ValidateOptions(c).message()); };
  ConformOptions c = o;
  c.real.kubeconfig = "";
  EXPECT_THAT(message(c), HasSubstr("--kubeconfig"));
  c = o;
  c.real.pod_image = "";
  EXPECT_THAT(message(c), HasSubstr("--pod_image"));
  c = o;
  c.scenarios = {"kubelet-restart"};
  EXPECT_THAT(message(c), HasSubstr("--restart_kubelet"));
  c.real.restart_kubelet = "systemctl restart kubelet";
  EXPECT_TRUE(ValidateOptions(c).ok());
  c = o;
  c.scenarios = {"serves-first", "prestart"};
  EXPECT_THAT(message(c), HasSubstr("none of them can be judged on a real kubelet"));
  // Beside simulated kubelets, a scenario only they judge is fine.
  c.kubelets = {*sim::ParseKubeletVersion("1.31")};
  c.scenarios = {"serves-first", "allocate"};
  EXPECT_TRUE(ValidateOptions(c).ok());
  // A DRA driver on a real kubelet alone, with the DRA scenarios it judges.
  c = o;
  c.dra_driver = "gpu.example.com";
  c.resources.clear();
  EXPECT_TRUE(ValidateOptions(c).ok()) << ValidateOptions(c);
  c.scenarios = {"dra-health", "dra-unknown-claim"};
  EXPECT_THAT(message(c), HasSubstr("none of them can be judged on a real kubelet"));
  EXPECT_THAT(message(c), HasSubstr("dra-several-requests"));
  c.scenarios = {"dra-kubelet-restart"};
  EXPECT_THAT(message(c), HasSubstr("--restart_kubelet"));
  // Every scenario a real kubelet judges is one of the simulated ones.
  for (const std::string& name : RealScenarios()) {
    EXPECT_TRUE(std::any_of(Scenarios().begin(), Scenarios().end(),
                            [&](const ScenarioInfo& s) { return name == s.name; }))
        << name;
  }
  for (const std::string& name : RealDraScenarios()) {
    EXPECT_TRUE(std::any_of(DraScenarios().begin(), DraScenarios().end(),
                            [&](const ScenarioInfo& s) { return name == s.name; }))
        << name;
  }
}

// A DRA run on a real node needs the cluster's resource.k8s.io and the
// kubelet's metrics (its registrations): a cluster without either is named
// before any cell runs.
class RealDraNodeTest : public ::testing::Test {
 protected:
  ConformOptions Options(sim::ApiServerSim& api) {
    EXPECT_TRUE(api.Start().ok());
    api.PutNode("node-a", "v1.37.2");
    const std::string kubeconfig = JoinPath(dir_.path(), "kubeconfig");
    EXPECT_TRUE(WriteFileAtomic(kubeconfig, absl::StrCat(R"(apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: ")", api.url(), R"("}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
)")).ok());
    ConformOptions o;
    o.dra_driver = "gpu.example.com";
    o.plugin_command = "exit 1";
    o.real_kubelets = {"1.37"};
    o.real.kubeconfig = kubeconfig;
    o.real.node = "node-a";
    o.real.pod_image = "busybox";
    o.work_root = dir_.path();
    o.on_cell = [this](const CellResult&, size_t, size_t) { ++cells_; };
    return o;
  }
  testing::ShortTempDir dir_;
  int cells_ = 0;
};

TEST_F(RealDraNodeTest, AClusterWithoutAResourceVersionWeSpeakIsNamed) {
  sim::ApiServerSim api({"", "", "t", {"v1alpha3"}});
  absl::StatusOr<std::vector<CellResult>> r = RunConformance(Options(api));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("serves resource.k8s.io v1alpha3; dpconform speaks v1, v1beta2 and v1beta1"));
  EXPECT_EQ(cells_, 0);
}

TEST_F(RealDraNodeTest, KubeletMetricsThatCannotBeReadAreNamed) {
  sim::ApiServerSim api({"", "", "t", {"v1"}});
  absl::StatusOr<std::vector<CellResult>> r = RunConformance(Options(api));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("the kubelet's registrations are read from its metrics"));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("GET /api/v1/nodes/node-a/proxy/metrics: HTTP 404"));
  EXPECT_EQ(cells_, 0);
}

TEST(RealKubeletTest, AnUnreachableNodeIsNamedBeforeAnyCellRuns) {
  testing::ShortTempDir dir;
  const std::string kubeconfig = JoinPath(dir.path(), "kubeconfig");
  ASSERT_TRUE(WriteFileAtomic(kubeconfig, R"(apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
)").ok());
  ConformOptions o;
  o.plugin_command = "exit 1";
  o.resources = {"example.com/gpu"};
  o.real_kubelets = {"1.37"};
  o.kubelets = {*sim::ParseKubeletVersion("1.31")};
  o.real.kubeconfig = kubeconfig;
  o.real.pod_image = "busybox";
  o.work_root = dir.path();
  int cells = 0;
  o.on_cell = [&](const CellResult&, size_t, size_t) { ++cells; };
  absl::StatusOr<std::vector<CellResult>> r = RunConformance(o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("the real node: "));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("127.0.0.1:1"));
  EXPECT_EQ(cells, 0);
}

TEST(ScenariosTest, EveryScenarioIsListedWithWhatItChecks) {
  std::vector<std::string> names;
  for (const ScenarioInfo& s : Scenarios()) {
    names.push_back(s.name);
    EXPECT_GT(std::string(s.checks).size(), 40u) << s.name;
  }
  EXPECT_THAT(names, ::testing::ElementsAre("registers", "serves-first", "plugin-watcher",
                                            "device-list", "list-size", "list-growth", "health", "allocate",
                                            "allocate-two", "preferred", "prestart",
                                            "kubelet-restart", "kubelet-crash", "plugin-restart",
                                            "allocate-restart", "checkpoint-lost", "rolling-update",
                                            "multi-resource"));
  for (const ScenarioInfo& s : Scenarios()) {
    const std::string name = s.name;
    EXPECT_EQ(s.opt_in, name == "checkpoint-lost" || name == "rolling-update" ||
                            name == "kubelet-crash")
        << name;
  }
  EXPECT_THAT(DefaultKubelets(),
              ::testing::ElementsAre("1.9", "1.15", "1.18", "1.24", "1.27", "1.30", "1.36",
                                     "1.37"));
}

}  // namespace
}  // namespace dpproxy::conform
