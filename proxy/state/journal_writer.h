// File: journal_writer.h
//
// Group commit over the allocation journal (journal_file.h). Callers queue
// entries under their owner's lock; whoever finds the journal free writes
// every entry queued, batch after batch (one write and, unless the batch
// holds answers alone, one fdatasync each), with the lock released across
// the I/O. After each batch the owner applies it under the lock
// (Owner::BatchWrittenLocked), and only then do the batch's callers hear
// the outcome.
//
// Answers and withdrawals (entries whose records are applied before they
// are written) go in batches of their own, ahead of queued reservations,
// and nobody waits for their sync: the next synced batch syncs them, or,
// once kAnswerSyncDelay has passed, the writer at work with its next batch
// or the writer's own thread (the journal free).
//
// The writer knows nothing of what the records mean. It shares its owner's
// mutex, because a batch's outcome and the owner's state change together:
// a snapshot encoded under the lock covers exactly the records applied.
// Every method named ...Locked, and open(), is called with that mutex held
// (asserted: the thread-safety analysis cannot tell that the owner's lock
// is this one); the others without it.
#ifndef DPPROXY_PROXY_STATE_JOURNAL_WRITER_H_
#define DPPROXY_PROXY_STATE_JOURNAL_WRITER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {

class JournalWriter {
 public:
  // Records waiting for the journal.
  struct Entry {
    std::vector<state::Allocation> records;
    // The records as the journal holds them (JournalFile::Encode); set by
    // EnqueueLocked.
    std::string encoded;
    std::function<void(absl::Status)> done;  // may be empty
    // An answer or a withdrawal: applied by the owner already, acknowledged
    // once written. Otherwise the owner applies the records once synced.
    bool written_only = false;
    // Owner's mark: the records hold their devices while queued.
    bool in_flight = false;
  };
  using Batch = std::vector<std::unique_ptr<Entry>>;

  // What one write did.
  struct Written {
    absl::Status status;
    // Records written, counting withdrawals a failed write left over.
    size_t records = 0;
    // The journal through this write: its size and record count.
    size_t journal_bytes = 0, journal_records = 0;
  };

  class Owner {
   public:
    virtual ~Owner() = default;
    // Under the lock, once per batch, before its callers are told.
    virtual void BatchWrittenLocked(const Batch& batch, const Written& written) = 0;
    // Under the lock: the writer's own sync of answers failed.
    virtual void SyncFailedLocked(const absl::Status& s) = 0;
  };

  // How long an answer written to the journal may wait for the next synced
  // batch (usually the next Allocate's reservation) before it is synced on
  // its own.
  static constexpr absl::Duration kAnswerSyncDelay = absl::Milliseconds(2);

  // `mu` and `owner` outlive the writer. Starts the answers' syncer thread.
  JournalWriter(std::string path, absl::Mutex* mu, Owner* owner);
  // Stops the syncer; nothing may be queued or written any more.
  ~JournalWriter();
  JournalWriter(const JournalWriter&) = delete;
  JournalWriter& operator=(const JournalWriter&) = delete;

  // The file, for its opening (StateLoader) and for whoever holds the
  // journal (AcquireLocked) or reads the records before what is applied.
  JournalFile* file() { return &journal_; }
  const std::string& path() const { return journal_.path(); }

  // Whether entries may be queued: the file is open and was not closed by
  // CloseLocked. Set once the file was opened.
  bool open() const {
    mu_->AssertHeld();
    return open_;
  }
  void SetOpenLocked(bool open) {
    mu_->AssertHeld();
    open_ = open;
  }

  // Queues `e`. True if the caller is to write the queue: it calls
  // WriteQueued once it has let go of the lock. False: the writer at work
  // takes `e` with its next batch.
  bool EnqueueLocked(std::unique_ptr<Entry> e);
  // Writes the queue, batch after batch, until it is empty or a saver wants
  // the journal; then frees it. Only after EnqueueLocked returned true.
  void WriteQueued() ABSL_LOCKS_EXCLUDED(mu_);

  // Exclusive use of the journal for a saver (dropping the records a
  // snapshot covers): waits, letting go of the lock meanwhile, for the
  // writer at work to hand it over between two batches.
  void AcquireLocked();
  // Frees the journal, or writes what queued while it was held (letting go
  // of the lock meanwhile).
  void ReleaseLocked() ABSL_NO_THREAD_SAFETY_ANALYSIS;  // lets go and takes it again
  // Waits for every queued entry to be written, syncs and closes the
  // file; nothing may be queued after it (open() is false).
  void CloseLocked();

  // Whether `n` entries are queued (including those being written) within
  // `timeout`.
  bool WaitForQueued(size_t n, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // How many writes there were (each one write(2), most one fdatasync) and
  // how many records they wrote: batching shows as records() > writes().
  int64_t writes() const { return writes_.load(); }
  int64_t records() const { return records_.load(); }

  // Called with the duration of each synced write (no lock held). Set
  // before the first entry.
  void SetSyncObserver(std::function<void(absl::Duration)> observe) {
    sync_observer_ = std::move(observe);
  }
  // For tests: called with no lock held right before each write
  // ("journal_write") and right after each fdatasync ("journal_synced").
  void SetTestHook(std::function<void(const char* where)> hook);
  // For tests: consulted right before each write; an error makes that write
  // fail with it, as a full disk would, writing nothing.
  void SetWriteFaultForTest(std::function<absl::Status()> fault) {
    write_fault_ = std::move(fault);
  }

 private:
  // One batch, taken off the queue: answers and withdrawals if any are
  // queued, else everything.
  Batch TakeBatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a write: what it did to the leftovers, the counts and the
  // answers' sync clock.
  void NoteWrittenLocked(const Batch& batch, const Written& w, bool synced,
                         absl::Time write_start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SyncLoop();
  // The syncer's sync of the answers written and left unsynced, with the
  // journal taken; the lock is let go around the fdatasync.
  void SyncAnswersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex* const mu_;
  Owner* const owner_;
  // Used only by whoever holds the journal (busy_), with mu_ let go.
  JournalFile journal_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Entries waiting, oldest first, and how many are queued or being
  // written.
  std::deque<std::unique_ptr<Entry>> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  // Savers waiting for the journal: the writer hands it over.
  int savers_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  // When the oldest answer written since the last sync was written
  // (InfiniteFuture: none), and how many answer batches were written.
  absl::Time unsynced_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  uint64_t answer_writes_ ABSL_GUARDED_BY(mu_) = 0;
  // Withdrawals whose write failed (a full disk): their allocations are
  // gone from the owner's memory, and their reservations would stay in the
  // journal until the next start. Written again, ahead of the next batch,
  // until one write takes them.
  std::string unwritten_withdrawals_ ABSL_GUARDED_BY(mu_);
  size_t unwritten_withdrawal_records_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> writes_{0};
  std::atomic<int64_t> records_{0};
  std::function<void(absl::Duration)> sync_observer_;
  std::function<void(const char*)> test_hook_;
  std::function<absl::Status()> write_fault_;
  // Syncs answers no synced batch took along within kAnswerSyncDelay, once
  // the journal is free (a writer at work syncs them itself).
  std::thread syncer_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_JOURNAL_WRITER_H_
