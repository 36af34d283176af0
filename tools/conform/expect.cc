#include "tools/conform/expect.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tools/kubelet_sim/kubelet_sim.h"

namespace dpproxy::conform {
namespace {

// A word of the file as an error message shows it: quoted, and cut at 80
// bytes (a line may be as long as the file).
std::string Echo(absl::string_view word) {
  constexpr size_t kMax = 80;
  if (word.size() <= kMax) return absl::StrCat("\"", word, "\"");
  return absl::StrCat("\"", word.substr(0, kMax), "...\" (", word.size(), " bytes)");
}

// "1.N" -> N; nullopt for anything else.
std::optional<int> Minor(absl::string_view release) {
  if (!absl::ConsumePrefix(&release, "1.")) return std::nullopt;
  int minor = 0;
  if (!absl::SimpleAtoi(release, &minor) || minor < 0) return std::nullopt;
  return minor;
}

// One RELEASES item into `e` (a copy per item: "1.9,1.25-1.37" is two).
absl::Status ParseReleases(absl::string_view item, Expectation* e) {
  if (item == "all") {
    e->first_minor = sim::kOldestKubeletMinor;
    e->last_minor = sim::kNewestKubeletMinor;
    return absl::OkStatus();
  }
  if (item == "real" || absl::StartsWith(item, "real:")) {
    e->real = true;
    if (item == "real") return absl::OkStatus();
    std::optional<int> m = Minor(item.substr(5));
    if (!m.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(Echo(item), " is not real:1.MINOR"));
    }
    e->real_minor = *m;
    return absl::OkStatus();
  }
  std::vector<absl::string_view> ends = absl::StrSplit(item, '-');
  std::optional<int> first = ends.size() <= 2 ? Minor(ends[0]) : std::nullopt;
  std::optional<int> last = ends.size() == 2 ? Minor(ends[1]) : first;
  if (!first.has_value() || !last.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Echo(item), " is not a release (1.25), a range (1.25-1.37), all, or real:1.37"));
  }
  for (int m : {*first, *last}) {
    if (m < sim::kOldestKubeletMinor || m > sim::kNewestKubeletMinor) {
      return absl::InvalidArgumentError(absl::StrCat("1.", m, " is not a release dpconform plays (1.",
                                                     sim::kOldestKubeletMinor, " to 1.",
                                                     sim::kNewestKubeletMinor, ")"));
    }
  }
  if (*first > *last) {
    return absl::InvalidArgumentError(absl::StrCat("the range ", Echo(item), " ends before it starts"));
  }
  e->first_minor = *first;
  e->last_minor = *last;
  return absl::OkStatus();
}

bool Covers(const Expectation& e, const CellResult& c) {
  if (e.scenario != c.scenario) return false;
  if (absl::StartsWith(c.kubelet, "real")) {
    if (!e.real) return false;
    if (e.real_minor == 0) return true;
    return Minor(absl::StripPrefix(c.kubelet, "real:")) == e.real_minor;
  }
  if (e.real) return false;
  // A simulated cell's release: "1.25", or a generation's alias.
  std::optional<int> m = Minor(c.kubelet);
  if (!m.has_value()) {
    absl::StatusOr<sim::KubeletVersion> k = sim::ParseKubeletVersion(c.kubelet);
    if (k.ok()) m = k->minor;
  }
  return m.has_value() && *m >= e.first_minor && *m <= e.last_minor;
}

}  // namespace

absl::StatusOr<std::vector<Expectation>> ParseExpectations(
    absl::string_view text, const std::string& file, const std::vector<std::string>& scenarios) {
  std::vector<Expectation> out;
  int n = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++n;
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#') continue;
    auto error = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(file, ":", n, ": ", what));
    };
    for (char ch : line) {
      if (static_cast<unsigned char>(ch) < 0x20 && ch != '\t') {
        return error(absl::StrCat("control character 0x",
                                  absl::Hex(static_cast<unsigned char>(ch), absl::kZeroPad2),
                                  " in the line"));
      }
    }
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.size() < 4) {
      return error(
          "expected SCENARIO RELEASES OUTCOME REASON (e.g. \"serves-first 1.25-1.37 FAIL "
          "registers before it serves\"); a known limitation needs its reason");
    }
    Expectation e;
    e.line = n;
    e.scenario = std::string(words[0]);
    if (std::find(scenarios.begin(), scenarios.end(), e.scenario) == scenarios.end()) {
      return error(absl::StrCat("unknown scenario ", Echo(e.scenario),
                                " (scenarios: ", absl::StrJoin(scenarios, ", "), ")"));
    }
    const std::string outcome = absl::AsciiStrToLower(words[2]);
    if (outcome == "fail") {
      e.outcome = Outcome::kFail;
    } else if (outcome == "blocked") {
      e.outcome = Outcome::kBlocked;
    } else {
      return error(absl::StrCat("outcome ", Echo(words[2]), " is neither FAIL nor blocked"));
    }
    // The reason: the line after the third word, as written.
    absl::string_view rest = line;
    for (int i = 0; i < 3; ++i) {
      rest = absl::StripLeadingAsciiWhitespace(rest.substr(rest.find(words[i]) + words[i].size()));
    }
    e.reason = std::string(rest);
    for (absl::string_view item : absl::StrSplit(words[1], ',', absl::SkipEmpty())) {
      Expectation one = e;
      if (absl::Status s = ParseReleases(item, &one); !s.ok()) return error(std::string(s.message()));
      out.push_back(std::move(one));
    }
  }
  return out;
}

void ApplyExpectations(const std::vector<Expectation>& expectations, const std::string& file,
                       std::vector<CellResult>* cells) {
  auto find = [&](const CellResult& c) -> const Expectation* {
    for (const Expectation& e : expectations) {
      if (Covers(e, c)) return &e;
    }
    return nullptr;
  };
  auto text = [&](const Expectation& e) {
    return absl::StrCat(file, ":", e.line, ": ", e.reason);
  };
  for (CellResult& c : *cells) {
    const Expectation* e = find(c);
    if (e == nullptr) continue;
    if (c.outcome == e->outcome) {
      c.known = text(*e);
    } else if (c.outcome == Outcome::kPass) {
      c.fixed = text(*e);
    }
  }
  // Blocked by a known failure of the same release: known too.
  for (CellResult& c : *cells) {
    if (c.outcome != Outcome::kBlocked || !c.known.empty() || c.blocked_by.empty()) continue;
    for (const CellResult& by : *cells) {
      if (by.kubelet == c.kubelet && by.scenario == c.blocked_by && by.outcome == Outcome::kFail &&
          !by.known.empty()) {
        c.known = absl::StrCat("blocked by ", by.scenario, ", known: ", by.known);
      }
    }
  }
}

bool NewFailure(const CellResult& c) {
  return (c.outcome == Outcome::kFail || c.outcome == Outcome::kBlocked) && c.known.empty();
}

}  // namespace dpproxy::conform
