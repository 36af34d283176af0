// dpconform's known limitations (--expect, expect.h) and its mapping of
// scenarios to Kubernetes' own tests (upstream.h).
#include "tools/conform/expect.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/process.h"
#include "tools/conform/dra.h"
#include "tools/conform/report.h"
#include "tools/conform/upstream.h"

namespace dpproxy::conform {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::vector<std::string> kNames = {"registers", "serves-first", "allocate",
                                         "kubelet-restart"};

absl::StatusOr<std::vector<Expectation>> Parse(const std::string& text) {
  return ParseExpectations(text, "known.txt", kNames);
}

std::string Error(const std::string& text) {
  absl::StatusOr<std::vector<Expectation>> r = Parse(text);
  EXPECT_FALSE(r.ok()) << text;
  return r.ok() ? "" : std::string(r.status().message());
}

CellResult Cell(const std::string& scenario, const std::string& kubelet, Outcome o) {
  CellResult c;
  c.scenario = scenario;
  c.kubelet = kubelet;
  c.generation = kubelet;
  c.outcome = o;
  c.summary = absl::StrCat(scenario, " on ", kubelet);
  return c;
}

TEST(ExpectTest, ParsesReleasesRangesListsAllAndRealKubelets) {
  absl::StatusOr<std::vector<Expectation>> r = Parse(
      "# the sample plugin\n"
      "\n"
      "serves-first 1.25-1.37 FAIL registers first, then serves (#12)\n"
      "  registers 1.9,1.10 fail  speaks v1beta1 only\n"
      "allocate all blocked needs a device\n"
      "kubelet-restart real:1.37 FAIL the node's kubelet is restarted by hand\n"
      "kubelet-restart real FAIL any real node\n");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 6u);
  const Expectation& e = (*r)[0];
  EXPECT_EQ(e.scenario, "serves-first");
  EXPECT_EQ(e.first_minor, 25);
  EXPECT_EQ(e.last_minor, 37);
  EXPECT_EQ(e.outcome, Outcome::kFail);
  EXPECT_EQ(e.reason, "registers first, then serves (#12)");
  EXPECT_EQ(e.line, 3);
  EXPECT_EQ((*r)[1].first_minor, 9);
  EXPECT_EQ((*r)[1].last_minor, 9);
  EXPECT_EQ((*r)[2].first_minor, 10);
  EXPECT_EQ((*r)[2].reason, "speaks v1beta1 only");
  EXPECT_EQ((*r)[3].outcome, Outcome::kBlocked);
  EXPECT_EQ((*r)[3].first_minor, sim::kOldestKubeletMinor);
  EXPECT_EQ((*r)[3].last_minor, sim::kNewestKubeletMinor);
  EXPECT_TRUE((*r)[4].real);
  EXPECT_EQ((*r)[4].real_minor, 37);
  EXPECT_TRUE((*r)[5].real);
  EXPECT_EQ((*r)[5].real_minor, 0);
}

TEST(ExpectTest, EachMistakeIsNamedWithItsLine) {
  EXPECT_THAT(Error("\nregisters 1.9 FAIL\n"),
              HasSubstr("known.txt:2: expected SCENARIO RELEASES OUTCOME REASON"));
  EXPECT_THAT(Error("regsiters 1.9 FAIL typo\n"),
              HasSubstr("known.txt:1: unknown scenario \"regsiters\" (scenarios: registers, "
                        "serves-first, allocate, kubelet-restart)"));
  EXPECT_THAT(Error("registers 1.9 broken why\n"),
              HasSubstr("outcome \"broken\" is neither FAIL nor blocked"));
  EXPECT_THAT(Error("registers 1.x FAIL why\n"),
              HasSubstr("\"1.x\" is not a release (1.25), a range (1.25-1.37), all, or real:1.37"));
  EXPECT_THAT(Error("registers 1.30-1.25 FAIL why\n"),
              HasSubstr("the range \"1.30-1.25\" ends before it starts"));
  EXPECT_THAT(Error("registers 1.99 FAIL why\n"),
              HasSubstr("1.99 is not a release dpconform plays"));
  EXPECT_THAT(Error("registers real:37 FAIL why\n"), HasSubstr("\"real:37\" is not real:1.MINOR"));
  EXPECT_THAT(Error("registers 1.9 FAIL a\x01reason\n"),
              HasSubstr("known.txt:1: control character 0x01"));
}

// A declared failure is known; a cell it blocked is known through it; a
// declared failure that passes is reported as fixed; anything else that
// fails is new, including a cell declared FAIL that ended blocked by an
// undeclared failure.
TEST(ExpectTest, KnownFixedAndNewCells) {
  absl::StatusOr<std::vector<Expectation>> r =
      Parse("registers 1.9 FAIL v1beta1 only\nserves-first 1.25-1.37 FAIL registers first\n"
            "allocate 1.31 FAIL flaky device\n");
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<CellResult> cells = {
      Cell("registers", "1.9", Outcome::kFail),
      Cell("allocate", "1.9", Outcome::kBlocked),
      Cell("serves-first", "1.25", Outcome::kFail),
      Cell("serves-first", "1.37", Outcome::kPass),
      Cell("serves-first", "1.24", Outcome::kFail),
      Cell("registers", "1.31", Outcome::kFail),
      Cell("allocate", "1.31", Outcome::kBlocked),
  };
  cells[1].blocked_by = "registers";
  cells[6].blocked_by = "registers";
  ApplyExpectations(*r, "known.txt", &cells);
  EXPECT_EQ(cells[0].known, "known.txt:1: v1beta1 only");
  EXPECT_THAT(cells[1].known, HasSubstr("blocked by registers, known: known.txt:1"));
  EXPECT_EQ(cells[2].known, "known.txt:2: registers first");
  EXPECT_EQ(cells[3].fixed, "known.txt:2: registers first");
  EXPECT_EQ(cells[4].known, "");  // 1.24 is outside the range
  EXPECT_EQ(cells[5].known, "");
  EXPECT_EQ(cells[6].known, "") << "declared FAIL, ended blocked by an undeclared failure";
  std::vector<bool> fresh;
  for (const CellResult& c : cells) fresh.push_back(NewFailure(c));
  EXPECT_THAT(fresh, ::testing::ElementsAre(false, false, false, false, true, true, true));

  const Totals t = Count(cells);
  EXPECT_EQ(t.known, 3);
  EXPECT_EQ(t.fixed, 1);
  EXPECT_THAT(TotalsLine(cells),
              HasSubstr("7 cells: 1 passed, 4 failed, 2 blocked, 0 not applicable; 3 of the "
                        "failed and blocked known (--expect), 1 declared failure(s) now passing"));

  // The table marks them, lists only new failures under Failures, and the
  // known and fixed ones in their own sections.
  const std::string table = RenderTable(cells);
  EXPECT_THAT(table, HasSubstr("known"));
  EXPECT_THAT(table, HasSubstr("Known limitations (--expect; not counted against the run):\n"
                               "  registers on kubelet 1.9 (FAIL): registers on 1.9\n"
                               "    known.txt:1: v1beta1 only\n"));
  EXPECT_THAT(table, HasSubstr("Declared failures that now pass (take them out of the --expect "
                               "file):\n  serves-first on kubelet 1.37: known.txt:2"));
  const std::string failures = table.substr(table.find("Failures:"));
  EXPECT_THAT(failures.substr(0, failures.find("Blocked")),
              Not(HasSubstr("serves-first on kubelet 1.25")));
  EXPECT_THAT(failures, HasSubstr("serves-first on kubelet 1.24"));

  // JSON names each; JUnit skips the known ones and counts only new failures.
  const std::string json = RenderJson(ConformOptions(), cells);
  EXPECT_THAT(json, HasSubstr("\"known\": \"known.txt:1: v1beta1 only\""));
  EXPECT_THAT(json, HasSubstr("\"fixed\": \"known.txt:2: registers first\""));
  EXPECT_THAT(json, HasSubstr("\"known\": 3"));
  EXPECT_THAT(json, Not(HasSubstr("wall_seconds")));
  EXPECT_THAT(RenderJson(ConformOptions(), cells, absl::Milliseconds(24400)),
              HasSubstr("\"wall_seconds\": 24.4"));
  const std::string junit = RenderJUnit(ConformOptions(), cells);
  EXPECT_THAT(junit, HasSubstr("<testsuites name=\"dpconform\" tests=\"7\" failures=\"3\""));
  EXPECT_THAT(junit, HasSubstr("<skipped message=\"known limitation (known.txt:1: v1beta1 only): "
                               "registers on 1.9\"/>"));
  EXPECT_THAT(junit, HasSubstr("declared a failure, now passes: known.txt:2"));
  const std::string path = absl::StrCat(::testing::TempDir(), "/known.xml");
  ASSERT_TRUE(WriteFileAtomic(path, junit).ok());
  const std::string cmd = absl::StrCat("xmllint --noout --schema '",
                                       testing::Runfile("tests/conform/junit.xsd"), "' '", path,
                                       "' 2>&1");
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string said;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) said += buf;
  EXPECT_EQ(::pclose(p), 0) << "the JUnit file with known cells does not validate: " << said;
  EXPECT_THAT(RenderMarkdown(ConformOptions(), cells), HasSubstr("(failed, known)"));
  EXPECT_THAT(RenderHtml(ConformOptions(), cells), HasSubstr("class=\"known\""));
}

// A real kubelet's cell is covered by real expectations only, and a
// simulated one by simulated ranges only.
TEST(ExpectTest, RealAndSimulatedCellsAreKeptApart) {
  absl::StatusOr<std::vector<Expectation>> r =
      Parse("registers real:1.37 FAIL real only\nallocate all FAIL simulated only\n");
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<CellResult> cells = {
      Cell("registers", "real:1.37", Outcome::kFail), Cell("registers", "real:1.36", Outcome::kFail),
      Cell("registers", "1.37", Outcome::kFail), Cell("allocate", "real:1.37", Outcome::kFail),
      Cell("allocate", "1.20", Outcome::kFail)};
  ApplyExpectations(*r, "k", &cells);
  EXPECT_NE(cells[0].known, "");
  EXPECT_EQ(cells[1].known, "");
  EXPECT_EQ(cells[2].known, "");
  EXPECT_EQ(cells[3].known, "");
  EXPECT_NE(cells[4].known, "");
}

// Every scenario names the upstream tests it stands for (or none, with
// why), and docs/conformance.md's table shows each of them.
TEST(UpstreamTest, EveryScenarioIsMappedAndTheDocsShowIt) {
  std::vector<std::string> names;
  for (const ScenarioInfo& s : Scenarios()) names.push_back(s.name);
  for (const ScenarioInfo& s : DraScenarios()) names.push_back(s.name);
  absl::StatusOr<std::string> docs = ReadFile(testing::Runfile("docs/conformance.md"));
  ASSERT_TRUE(docs.ok()) << docs.status();
  for (const std::string& n : names) {
    const UpstreamMapping* m = UpstreamOf(n);
    ASSERT_NE(m, nullptr) << n << " has no upstream mapping";
    EXPECT_GT(std::string(m->relation).size(), 20u) << n;
    // Its row in the docs' mapping table: the scenario, then its tests.
    const size_t row =
        docs->find(absl::StrCat("\n| `", n, "` | "), docs->find("## Mapped to Kubernetes"));
    ASSERT_NE(row, std::string::npos) << n << " has no row in docs/conformance.md";
    const std::string line = docs->substr(row + 1, docs->find('\n', row + 1) - row - 1);
    for (const UpstreamTest& t : m->tests) {
      EXPECT_TRUE(absl::StrContains(line, t.test)) << n << ": " << t.test << " not in: " << line;
      // The node e2e tests, or the cluster e2e tests of DRA.
      const std::string file = t.file;
      EXPECT_TRUE(absl::StartsWith(file, "test/e2e_node/") || absl::StartsWith(file, "test/e2e/dra/"))
          << n << ": " << file;
    }
  }
  for (const UpstreamMapping& m : UpstreamMappings()) {
    EXPECT_THAT(names, ::testing::Contains(std::string(m.scenario))) << m.scenario;
  }
  EXPECT_EQ(UpstreamMappings().size(), names.size());
  EXPECT_EQ(UpstreamText(*UpstreamOf("list-size")), "none upstream");
  EXPECT_EQ(UpstreamText(*UpstreamOf("dra-kubelet-restart")),
            "test/e2e_node/dra_test.go: \"must register after Kubelet restart\"");
}

// The example in docs/conformance.md's rules for plugin authors is read as
// written.
TEST(ExpectTest, TheDocsExampleParses) {
  absl::StatusOr<std::string> docs = ReadFile(testing::Runfile("docs/conformance.md"));
  ASSERT_TRUE(docs.ok()) << docs.status();
  const size_t at = docs->find("**Declaring known limitations.**");
  ASSERT_NE(at, std::string::npos);
  const size_t open = docs->find("```\n", at);
  const size_t close = docs->find("```\n", open + 4);
  ASSERT_NE(close, std::string::npos);
  std::vector<std::string> names;
  for (const ScenarioInfo& s : Scenarios()) names.push_back(s.name);
  absl::StatusOr<std::vector<Expectation>> r =
      ParseExpectations(docs->substr(open + 4, close - open - 4), "docs", names);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), 5u);  // the allocate line names two items
}

}  // namespace
}  // namespace dpproxy::conform
