// File: expect.h
//
// Known limitations a plugin's authors declare (--expect=FILE), so that a
// CI job fails only on a new failure. One per line:
//
//   # comment
//   SCENARIO RELEASES OUTCOME REASON...
//
//   serves-first 1.25-1.37 FAIL registers before it serves (#112)
//   kubelet-restart 1.9,1.10 blocked needs registers, which 1.9 refuses
//
// RELEASES: a release (1.25), a range (1.25-1.37), several joined by
// commas, "all", or a real kubelet (real:1.37, or real for any). OUTCOME:
// FAIL or blocked. The reason is required: it is printed beside the cell.
// A blocked cell is also known when the failure that blocked it is.
#ifndef DPPROXY_TOOLS_CONFORM_EXPECT_H_
#define DPPROXY_TOOLS_CONFORM_EXPECT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tools/conform/conform.h"

namespace dpproxy::conform {

struct Expectation {
  std::string scenario;
  // Simulated releases by minor, inclusive; `real` for real kubelets
  // (`real_minor` 0: any).
  int first_minor = 0, last_minor = 0;
  bool real = false;
  int real_minor = 0;
  Outcome outcome = Outcome::kFail;
  std::string reason;
  int line = 0;  // in the file, for messages
};

// Parses an expectations file's text; `scenarios` are the names a line may
// use. An error names the file, the line and what is wrong.
absl::StatusOr<std::vector<Expectation>> ParseExpectations(
    absl::string_view text, const std::string& file, const std::vector<std::string>& scenarios);

// Marks each cell an expectation covers: a failed or blocked cell as
// `known` (the expectation's file, line and reason), a cell that passes
// where a failure was expected as `fixed`. A blocked cell whose blocking
// failure in the same release is known is known too.
void ApplyExpectations(const std::vector<Expectation>& expectations, const std::string& file,
                       std::vector<CellResult>* cells);

// Whether a cell counts against the run: failed or blocked, and not known.
bool NewFailure(const CellResult& c);

}  // namespace dpproxy::conform

#endif  // DPPROXY_TOOLS_CONFORM_EXPECT_H_
