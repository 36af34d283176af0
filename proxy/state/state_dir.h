// File: state_dir.h
//
// A state directory as dpproxy would find it at start, read without
// changing anything: for `dpctl state` and `dpctl verify`, and for tests.
// The same rules as StateKeeper::Load: a snapshot proven damaged falls back
// to the previous generation (previous_generation.h), the journal's intact
// records are kept, a torn tail is cut.
#ifndef DPPROXY_PROXY_STATE_STATE_DIR_H_
#define DPPROXY_PROXY_STATE_STATE_DIR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {

// The snapshot and the journal of a state directory, read only: what
// dpproxy would load. A missing journal is empty; kDataLoss if a file is
// proven damaged, kFailedPrecondition if dpproxy would refuse to start.
absl::StatusOr<state::State> ReadStateDir(const std::string& dir);

// What dpproxy would find in a state directory at start (dpctl verify).
// `problems` lists every condition dpproxy would refuse to start on or
// repair (moved aside, fallen back, cut, rewritten, learned back); empty
// means intact.
struct StateDirReport {
  state::State state;  // what would be loaded
  std::vector<std::string> problems;
  // dpproxy would refuse to start (unreadable, not a file, a link).
  bool refuses_start = false;
  // A file is proven corrupt (dpproxy moves it aside).
  bool untrusted = false;
};
StateDirReport InspectStateDir(const std::string& dir);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_STATE_DIR_H_
