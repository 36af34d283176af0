// StateKeeper's start (state_keeper.h): what StateLoader read back taken
// in, and folded into a fresh snapshot.
#include <glog/logging.h>

#include <utility>

#include "proxy/state/state_keeper.h"

namespace dpproxy {

absl::StatusOr<state::State> StateKeeper::Load(bool summary) {
  // Read with save_mu_ alone: no save writes the files meanwhile, while
  // readers of the state (status, probes) wait only for it to be taken in.
  // No record touches the journal before it is marked open below.
  absl::MutexLock save(&save_mu_);
  JournalFile* journal = writer_.file();
  absl::StatusOr<StateLoader::Loaded> loaded =
      StateLoader(files_.store(), journal, files_.previous(), events_).Load();
  absl::MutexLock lock(&mu_);
  writer_.SetOpenLocked(journal->is_open());
  if (!loaded.ok()) return loaded.status();
  if (loaded->damaged) damaged_at_load_ = true;
  journal_applied_bytes_ = journal->size();
  journal_applied_records_ = journal->records();
  state_ = std::move(loaded->state);
  allocations_ = std::move(loaded->allocations);
  resources_.TakeFrom(&state_);
  RebuildIndexLocked();
  if (holds_.AnyQuarantined()) ++quarantine_version_;
  // Fold what the journal held into a fresh snapshot. A disk that takes no
  // write (full) does not stop the start: the records stay in the journal
  // (a failed save drops none), what was loaded is served, Allocates are
  // refused while nothing can be written, and a later save folds them.
  if (loaded->journal_records > 0) {
    if (absl::Status save = SaveLocked(); !save.ok()) {
      LOG(ERROR) << "cannot fold the journal into a new snapshot at start (" << save.message()
                 << "): dpproxy starts on the " << allocations_.size()
                 << " allocation(s) it loaded, the journal keeps their records, and new "
                    "Allocates are refused until the state directory takes writes again";
    }
  }
  return summary ? SummaryLocked() : FullStateLocked();
}

}  // namespace dpproxy
