// File: state_dir.h
//
// A state directory as dpproxy would find it at start, read without
// changing anything: for `dpctl state` and `dpctl verify`, and for tests.
// The same rules as StateKeeper::Load: a snapshot proven damaged falls back
// to the previous generation (previous_generation.h), the journal's intact
// records are kept, a torn tail is cut.
#ifndef DPPROXY_PROXY_STATE_STATE_DIR_H_
#define DPPROXY_PROXY_STATE_STATE_DIR_H_

#include <optional>
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

// A state directory with none of its files (state.pb, journal.wal, and
// their previous generation) is new, or lost them all. To tell the two
// apart dpproxy keeps a note in its other directory, the plugin directory,
// naming the state directory it loaded (written at every start): a state
// directory found without files while the note names it lost them (damage:
// dpproxy says so and learns back from the kubelet); otherwise it is new
// (a first start, quiet).
inline constexpr char kStateNoteName[] = ".dpproxy-state";
// No state file at all in `dir` (a missing directory included).
bool StateDirEmpty(const std::string& dir);
// Writes the note (durably) naming `state_dir`, keeping the time of a note
// that names it already.
absl::Status NoteStateDirInUse(const std::string& plugin_dir, const std::string& state_dir);
// When the note in `plugin_dir` says `state_dir` came into use (RFC 3339),
// if it names that directory; nullopt if there is no note or it names
// another.
std::optional<std::string> StateDirNotedSince(const std::string& plugin_dir,
                                              const std::string& state_dir);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_STATE_DIR_H_
