// dpconform's --expect file: any text is read into expectations or refused
// with an error naming the file and a line of it, never a crash; what is
// read is well formed, and applying it to a grid leaves every cell's
// outcome as it was.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tools/conform/conform.h"
#include "tools/conform/expect.h"

namespace {

using dpproxy::conform::CellResult;
using dpproxy::conform::Outcome;

const std::vector<std::string>& Names() {
  static const auto* const kNames = [] {
    auto* names = new std::vector<std::string>;
    for (const auto& s : dpproxy::conform::Scenarios()) names->push_back(s.name);
    return names;
  }();
  return *kNames;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto parsed = dpproxy::conform::ParseExpectations(text, "f.expect", Names());
  if (!parsed.ok()) {
    // Named: the file and a line, and bounded (a long line is not echoed whole).
    if (!absl::StartsWith(parsed.status().message(), "f.expect:")) std::abort();
    if (parsed.status().message().size() > 2048) std::abort();
    return 0;
  }
  for (const auto& e : *parsed) {
    if (e.reason.empty() || e.line < 1) std::abort();
    if (!e.real && (e.first_minor > e.last_minor || e.first_minor < 9)) std::abort();
    if (e.outcome != Outcome::kFail && e.outcome != Outcome::kBlocked) std::abort();
    for (char ch : e.reason) {
      if (static_cast<unsigned char>(ch) < 0x20 && ch != '\t') std::abort();
    }
  }
  // A small grid: every outcome on two releases, a blocked cell naming its cause.
  std::vector<CellResult> cells;
  for (const char* kubelet : {"1.9", "1.37"}) {
    for (Outcome o : {Outcome::kPass, Outcome::kFail, Outcome::kBlocked, Outcome::kNotApplicable}) {
      CellResult c;
      c.kubelet = kubelet;
      c.scenario = o == Outcome::kBlocked ? "allocate" : Names()[static_cast<size_t>(o) % Names().size()];
      c.outcome = o;
      if (o == Outcome::kBlocked) c.blocked_by = Names()[1];
      cells.push_back(c);
    }
  }
  std::vector<CellResult> applied = cells;
  dpproxy::conform::ApplyExpectations(*parsed, "f.expect", &applied);
  for (size_t i = 0; i < cells.size(); ++i) {
    if (applied[i].outcome != cells[i].outcome) std::abort();
    // Only a failed or blocked cell is known; only a passing one is fixed.
    const bool failed = cells[i].outcome == Outcome::kFail || cells[i].outcome == Outcome::kBlocked;
    if (!applied[i].known.empty() && !failed) std::abort();
    if (!applied[i].fixed.empty() && cells[i].outcome != Outcome::kPass) std::abort();
  }
  return 0;
}
