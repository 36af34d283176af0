#include "proxy/state/journal_writer.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "proxy/util/thread_name.h"

namespace dpproxy {

JournalWriter::JournalWriter(std::string path, absl::Mutex* mu, Owner* owner)
    : mu_(mu), owner_(owner), journal_(std::move(path)) {
  syncer_ = std::thread([this] {
    NameThisThread("dpp-syncer");
    SyncLoop();
  });
}

JournalWriter::~JournalWriter() {
  {
    absl::MutexLock lock(mu_);
    stopping_ = true;
  }
  syncer_.join();
}

void JournalWriter::SetTestHook(std::function<void(const char* where)> hook) {
  test_hook_ = std::move(hook);
  journal_.SetSyncHook([this] { test_hook_("journal_synced"); });
}

bool JournalWriter::EnqueueLocked(std::unique_ptr<Entry> e) {
  mu_->AssertHeld();
  e->encoded = JournalFile::Encode(e->records);
  queue_.push_back(std::move(e));
  ++queued_;
  if (busy_) return false;
  busy_ = true;
  return true;
}

JournalWriter::Batch JournalWriter::TakeBatchLocked() {
  Batch batch;
  const bool written_only =
      std::any_of(queue_.begin(), queue_.end(), [](const auto& e) { return e->written_only; });
  std::deque<std::unique_ptr<Entry>> rest;
  for (auto& e : queue_) {
    if (!written_only || e->written_only) {
      batch.push_back(std::move(e));
    } else {
      rest.push_back(std::move(e));
    }
  }
  queue_ = std::move(rest);
  return batch;
}

void JournalWriter::WriteQueued() {
  absl::MutexLock lock(mu_);
  while (!queue_.empty() && savers_waiting_ == 0) {
    Batch batch = TakeBatchLocked();
    // Answers left unsynced for kAnswerSyncDelay are synced with this
    // batch, whatever it holds: a writer kept at work by answers alone
    // keeps the syncer's promise itself.
    const bool answers_only = batch.front()->written_only;
    const bool synced = !answers_only || (unsynced_since_ != absl::InfiniteFuture() &&
                                          absl::Now() >= unsynced_since_ + kAnswerSyncDelay);
    std::string data = unwritten_withdrawals_;  // a failed write's withdrawals first
    Written w;
    w.records = unwritten_withdrawal_records_;
    for (const auto& e : batch) {
      data += e->encoded;
      w.records += e->records.size();
    }
    mu_->Unlock();
    if (test_hook_) test_hook_("journal_write");
    const absl::Time write_start = absl::Now();
    const absl::Status fault = write_fault_ ? write_fault_() : absl::OkStatus();
    w.status = !fault.ok() ? fault
                           : journal_.AppendEncoded(data, w.records,
                                                    synced ? JournalFile::Durability::kSynced
                                                           : JournalFile::Durability::kWritten);
    if (sync_observer_ && synced) sync_observer_(absl::Now() - write_start);
    w.journal_bytes = journal_.size();
    w.journal_records = journal_.records();
    mu_->Lock();
    NoteWrittenLocked(batch, w, synced, write_start);
    owner_->BatchWrittenLocked(batch, w);
    // The callers hear it with no lock held (each may finish a kubelet's
    // call); an error refuses every record of the batch: none was recorded.
    mu_->Unlock();
    for (auto& e : batch) {
      if (e->done) e->done(w.status);
    }
    mu_->Lock();
  }
  busy_ = false;
}

void JournalWriter::NoteWrittenLocked(const Batch& batch, const Written& w, bool synced,
                                      absl::Time write_start) {
  ++writes_;
  queued_ -= batch.size();
  if (w.status.ok()) {
    records_ += static_cast<int64_t>(w.records);
    unwritten_withdrawals_.clear();
    unwritten_withdrawal_records_ = 0;
    // Answers left unsynced are synced by the next synced batch (one is
    // usually on its way: the next Allocate's reservation), by this
    // writer's next batch once they are due, or by the syncer after
    // kAnswerSyncDelay.
    if (synced) {
      unsynced_since_ = absl::InfiniteFuture();
    } else {
      ++answer_writes_;
      if (unsynced_since_ == absl::InfiniteFuture()) unsynced_since_ = write_start;
    }
    return;
  }
  // Withdrawals are gone from the owner's memory already: written with the
  // next batch, so that no reservation they end is left in the journal
  // once the disk takes writes again.
  for (const auto& e : batch) {
    if (!e->written_only) continue;
    const bool withdrawals =
        std::all_of(e->records.begin(), e->records.end(), [](const state::Allocation& a) {
          return a.stage() == state::Allocation::WITHDRAWN;
        });
    if (!withdrawals) continue;
    unwritten_withdrawals_ += e->encoded;
    unwritten_withdrawal_records_ += e->records.size();
  }
}

void JournalWriter::AcquireLocked() {
  mu_->AssertHeld();
  ++savers_waiting_;
  mu_->Await(absl::Condition(
      +[](JournalWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return !w->busy_; }, this));
  --savers_waiting_;
  busy_ = true;
}

void JournalWriter::ReleaseLocked() {
  mu_->AssertHeld();
  if (queue_.empty()) {
    busy_ = false;
    return;
  }
  mu_->Unlock();
  WriteQueued();  // still busy: this thread is the writer now
  mu_->Lock();
}

void JournalWriter::CloseLocked() {
  mu_->AssertHeld();
  mu_->Await(absl::Condition(
      +[](JournalWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
        return !w->busy_ && w->queue_.empty();
      },
      this));
  open_ = false;
  if (absl::Status s = journal_.Sync(); !s.ok()) {
    LOG(ERROR) << "cannot sync the journal " << journal_.path() << " before closing it: "
               << s.message();
  }
  journal_.Close();
}

bool JournalWriter::WaitForQueued(size_t n, absl::Duration timeout) {
  struct Want {
    JournalWriter* w;
    size_t n;
  } want{this, n};
  absl::MutexLock lock(mu_);
  return mu_->AwaitWithTimeout(
      absl::Condition(
          +[](Want* x) ABSL_EXCLUSIVE_LOCKS_REQUIRED(x->w->mu_) { return x->w->queued_ >= x->n; },
          &want),
      timeout);
}

void JournalWriter::SyncLoop() {
  absl::MutexLock lock(mu_);
  for (;;) {
    // Asleep until an answer is written and left unsynced.
    mu_->Await(absl::Condition(
        +[](JournalWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
          return w->unsynced_since_ != absl::InfiniteFuture() || w->stopping_;
        },
        this));
    // Then woken by the clock alone, not by each answer or sync: at the
    // oldest unsynced answer's due time, or every kAnswerSyncDelay while
    // answers keep being written and synced by the batches after them.
    // Asleep again once a delay passes with no answer written.
    for (;;) {
      if (stopping_) return;
      if (unsynced_since_ == absl::InfiniteFuture()) {
        const uint64_t seen = answer_writes_;
        mu_->AwaitWithTimeout(absl::Condition(&stopping_), kAnswerSyncDelay);
        if (answer_writes_ == seen && unsynced_since_ == absl::InfiniteFuture()) break;
        continue;
      }
      const absl::Time due = unsynced_since_ + kAnswerSyncDelay;
      if (absl::Now() < due) {
        mu_->AwaitWithDeadline(absl::Condition(&stopping_), due);
        continue;
      }
      // A writer at work syncs them itself (WriteQueued syncs its next
      // batch once an answer written before it is due), so it is left to
      // go on: taking the journal from it would leave the calls it was
      // about to answer to this thread. The journal is taken when free.
      if (busy_) {
        mu_->Await(absl::Condition(
            +[](JournalWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
              return !w->busy_ || w->unsynced_since_ == absl::InfiniteFuture() || w->stopping_;
            },
            this));
        continue;
      }
      if (!open_) {
        unsynced_since_ = absl::InfiniteFuture();  // closed (synced then) or never open
        continue;
      }
      busy_ = true;
      if (unsynced_since_ == absl::InfiniteFuture()) {  // a batch synced them meanwhile
        ReleaseLocked();  // writes what queued while savers waited
        continue;
      }
      SyncAnswersLocked();
    }
  }
}

void JournalWriter::SyncAnswersLocked() {
  unsynced_since_ = absl::InfiniteFuture();
  mu_->Unlock();
  const absl::Status synced = journal_.Sync();
  mu_->Lock();
  if (!synced.ok()) {
    LOG(ERROR) << "cannot sync answers in the journal " << journal_.path() << ": "
               << synced.message();
    owner_->SyncFailedLocked(synced);
  }
  ReleaseLocked();
}

}  // namespace dpproxy
