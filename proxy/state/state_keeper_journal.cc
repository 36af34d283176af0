// StateKeeper's write path (state_keeper.h): each Allocate's reservation
// and answer made into journal records and queued (journal_writer.h writes
// them in group commits), and each written batch applied to the
// allocations before the kubelet is answered.
#include "proxy/state/state_keeper.h"

#include <glog/logging.h>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "proxy/state/journal_records.h"

namespace dpproxy {

absl::Status StateKeeper::Record(const std::string& resource,
                                 const v1beta1::AllocateRequest& req,
                                 const v1beta1::AllocateResponse& resp,
                                 const BackendSide& backend) {
  absl::Notification recorded;
  absl::Status result;
  RecordAsync(resource, req, resp, backend, [&](absl::Status s) {
    result = std::move(s);
    recorded.Notify();
  });
  recorded.WaitForNotification();
  return result;
}

std::vector<state::Allocation> StateKeeper::NewRecordsLocked(
    const std::string& resource, const v1beta1::AllocateRequest& req,
    const v1beta1::AllocateResponse* resp, const BackendSide& backend) {
  std::vector<state::Allocation> records =
      AllocationRecords(resource, req, resp, backend, state_.next_allocation_id() + 1,
                        absl::ToUnixMillis(absl::Now()));
  state_.set_next_allocation_id(state_.next_allocation_id() + records.size());
  return records;
}

void StateKeeper::AddInFlightLocked(Pending* p) {
  for (const state::Allocation& a : p->records) {
    p->in_flight = true;
    holds_.StartInFlight(a);
  }
}

void StateKeeper::EndInFlightLocked(const Pending& p) {
  if (!p.in_flight) return;
  for (const state::Allocation& a : p.records) holds_.EndInFlight(a);
}

bool StateKeeper::EnqueueLocked(std::unique_ptr<Pending> p) {
  if (!p->written_only && holds_.one_holder_across_paths()) AddInFlightLocked(p.get());
  return writer_.EnqueueLocked(std::move(p));
}

void StateKeeper::Submit(const std::function<absl::Status(Pending*)>& build,
                         std::function<void(absl::Status)> done) {
  absl::Status refused;
  bool write = false;
  {
    absl::MutexLock lock(&mu_);
    auto me = std::make_unique<Pending>();
    refused = build(me.get());
    if (refused.ok()) {
      me->done = std::move(done);
      write = EnqueueLocked(std::move(me));
    }
  }
  if (!refused.ok()) {
    if (done) done(std::move(refused));
    return;
  }
  if (write) writer_.WriteQueued();
}

void StateKeeper::RecordAsync(const std::string& resource, const v1beta1::AllocateRequest& req,
                              const v1beta1::AllocateResponse& resp, const BackendSide& backend,
                              std::function<void(absl::Status)> done) {
  Submit(
      [&](Pending* me) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        absl::Status refused =
            CheckRecordableLocked(resource, req, backend.claims != nullptr);
        if (refused.ok()) me->records = NewRecordsLocked(resource, req, &resp, backend);
        return refused;
      },
      std::move(done));
}

AllocationJournal::Reservation StateKeeper::ReserveAsync(
    const std::string& resource, const v1beta1::AllocateRequest& req, const BackendSide& backend,
    std::function<void(absl::Status)> durable, bool readmission) {
  Reservation r;
  Submit(
      [&](Pending* me) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        absl::Status refused =
            CheckRecordableLocked(resource, req, backend.claims != nullptr, readmission);
        if (!refused.ok()) return refused;
        me->records = NewRecordsLocked(resource, req, nullptr, backend);
        r.count = static_cast<int>(me->records.size());
        r.first_id = r.count > 0 ? me->records.front().id() : 0;
        return absl::OkStatus();
      },
      std::move(durable));
  return r;
}

void StateKeeper::AnswerAsync(const Reservation& r, const v1beta1::AllocateResponse& resp,
                              std::function<void(absl::Status)> done,
                              const std::vector<state::DraClaim>* claims) {
  Submit(
      [&](Pending* me) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (handed_over_) return HandedOverError();
        if (!writer_.open()) {
          return absl::FailedPreconditionError("the allocation journal is not open");
        }
        me->written_only = true;
        me->records = AnswerRecords(r, resp, claims);
        // In memory at once: a snapshot taken before the records are
        // written holds the responses, and the records replay onto them
        // unchanged.
        for (const state::Allocation& a : me->records) {
          if (!a.has_claim()) {
            // The reservation has no response: appended to its bytes,
            // these fields set it and end the reservation.
            allocations_.AppendFields(a.id(), AnswerFields(a));
            continue;
          }
          std::string was;  // the claim the reservation named
          if (allocations_.Update(a.id(), [&](state::Allocation* held) {
                if (held->has_claim()) was = held->claim().uid();
                *held->mutable_response() = a.response();
                *held->mutable_claim() = a.claim();
                held->clear_stage();
              }) &&
              was != a.claim().uid()) {
            holds_.MoveClaim(a.id(), was, a.claim().uid());
          }
        }
        return absl::OkStatus();
      },
      std::move(done));
}

void StateKeeper::Withdraw(const Reservation& r) {
  bool write = false;
  {
    absl::MutexLock lock(&mu_);
    const std::vector<state::Allocation> gone =
        allocations_.EraseRange(r.first_id, r.first_id + static_cast<uint64_t>(r.count));
    if (gone.empty()) return;  // never written, or released already
    for (const state::Allocation& a : gone) UnindexLocked(a);
    allocation_count_ = static_cast<int>(allocations_.size());
    ++released_version_;
    if (handed_over_ || !writer_.open()) return;  // the next start replays it as held
    auto me = std::make_unique<Pending>();
    me->written_only = true;
    me->records = WithdrawalRecords(r);
    write = EnqueueLocked(std::move(me));
  }
  if (write) writer_.WriteQueued();
}

void StateKeeper::JournalReleasedLocked(const std::vector<uint64_t>& ids) {
  if (ids.empty() || handed_over_ || !writer_.open()) return;
  auto me = std::make_unique<Pending>();
  me->written_only = true;
  me->records = WithdrawalRecords(ids);
  if (!EnqueueLocked(std::move(me))) return;  // the writer at work takes them
  mu_.Unlock();
  writer_.WriteQueued();
  mu_.Lock();
}

void StateKeeper::BatchWrittenLocked(const JournalWriter::Batch& batch,
                                     const JournalWriter::Written& w) {
  NoteWrite(w.status);
  for (const auto& p : batch) EndInFlightLocked(*p);
  if (!w.status.ok()) {
    LOG(ERROR) << "cannot append to the journal " << writer_.path() << ": "
               << w.status.message();
    events_->Emit("state_save_failed", {{"path", writer_.path()},
                                        {"error", std::string(w.status.message())},
                                        {"failures", write_failures_.load()},
                                        {"allocations_refused", w.records}});
    return;
  }
  journal_applied_bytes_ = w.journal_bytes;
  journal_applied_records_ = w.journal_records;
  for (const auto& p : batch) {
    if (p->written_only) continue;  // applied when it was queued
    size_t pos = 0;  // each record's encoding, as the journal holds it
    for (const state::Allocation& a : p->records) {
      IndexLocked(a);
      allocations_.PutOwnEncoding(a.id(), JournalFile::EncodedPayload(p->encoded, &pos));
    }
  }
  allocation_count_ = static_cast<int>(allocations_.size());
  // The records are durable in the journal; the snapshot that takes them
  // in is written by the compactor, off this path.
  if (CompactDueLocked() && !compacting_) compact_wanted_ = true;
}

void StateKeeper::SyncFailedLocked(const absl::Status& s) {
  NoteWrite(s);
  events_->Emit("state_save_failed", {{"path", writer_.path()},
                                      {"error", std::string(s.message())},
                                      {"failures", write_failures_.load()}});
}

}  // namespace dpproxy
