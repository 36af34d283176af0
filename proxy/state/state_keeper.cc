#include "proxy/state/state_keeper.h"

#include <glog/logging.h>

#include <stdio.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dpproxy {

namespace {

// Journal records beyond this are folded into a new snapshot.
constexpr size_t kCompactAfter = 1000;

std::string JournalPathFor(const std::string& snapshot) {
  size_t slash = snapshot.rfind('/');
  return slash == std::string::npos ? std::string("journal.wal")
                                    : snapshot.substr(0, slash + 1) + "journal.wal";
}

}  // namespace

StateKeeper::StateKeeper(std::string path, EventLog* events)
    : store_(path), journal_(JournalPathFor(path)), events_(events) {}

state::State StateKeeper::Load() {
  absl::StatusOr<state::State> s = store_.Load();
  absl::MutexLock lock(&mu_);
  absl::StatusOr<JournalFile::Replay> replay = journal_.Open();
  if (!replay.ok() && replay.status().code() == absl::StatusCode::kDataLoss) {
    // Not a journal at all: keep it aside, start a new one.
    const std::string aside =
        absl::StrCat(journal_.path(), ".corrupt-", absl::ToUnixSeconds(absl::Now()));
    LOG(ERROR) << replay.status().message() << "; moved aside to " << aside;
    events_->Emit("state_untrusted", {{"path", journal_.path()},
                                      {"error", std::string(replay.status().message())}});
    ::rename(journal_.path().c_str(), aside.c_str());
    replay = journal_.Open();
  }
  journal_ok_ = replay.ok();
  if (!replay.ok()) {
    LOG(ERROR) << "cannot open the allocation journal: " << replay.status().message();
  } else if (replay->cut_bytes > 0) {
    LOG(WARNING) << "journal " << journal_.path() << ": cut " << replay->cut_bytes
                 << " bytes of a record torn by a crash (it was never acknowledged)";
    events_->Emit("journal_torn_tail", {{"path", journal_.path()},
                                        {"bytes", replay->cut_bytes}});
  }
  if (s.ok()) {
    state_ = *std::move(s);
    if (replay.ok()) MergeJournal(replay->records, &state_);
    LOG(INFO) << "state loaded from " << store_.path() << ": " << state_.resources_size()
              << " resources, " << state_.allocations_size() << " allocations";
    events_->Emit("state_loaded", {{"path", store_.path()},
                                   {"resources", state_.resources_size()},
                                   {"allocations", state_.allocations_size()}});
  } else {
    state_ = state::State();
    // The journal alone still holds the allocations recorded since the last
    // snapshot; they are trusted (each record has its own checksum).
    if (replay.ok()) MergeJournal(replay->records, &state_);
    LOG(ERROR) << s.status().message();
    events_->Emit("state_untrusted", {{"path", store_.path()},
                                      {"error", std::string(s.status().message())}});
  }
  // Fold what the journal held into a fresh snapshot.
  if (replay.ok() && !replay->records.empty()) (void)SaveLocked();
  return state_;
}

absl::Status StateKeeper::SaveLocked() {
  state_.set_saved_unix_ms(absl::ToUnixMillis(absl::Now()));
  absl::Status s = store_.Save(state_);
  if (s.ok() && journal_ok_) {
    // Every journaled allocation is in the snapshot now. A crash before the
    // reset replays them again; Load() keeps one of each.
    if (absl::Status r = journal_.Reset(); !r.ok()) {
      LOG(ERROR) << "cannot reset the journal: " << r.message();
    }
  }
  if (!s.ok()) {
    LOG(ERROR) << "cannot save state to " << store_.path() << " (the previous file is intact): "
               << s.message();
    events_->Emit("state_save_failed", {{"path", store_.path()},
                                        {"error", std::string(s.message())},
                                        {"failures", store_.save_failures()}});
  }
  return s;
}

absl::Status StateKeeper::Record(const std::string& resource,
                                 const v1beta1::AllocateRequest& req,
                                 const v1beta1::AllocateResponse& resp,
                                 const std::string& backend_api,
                                 const std::string& backend_endpoint) {
  absl::MutexLock lock(&mu_);
  const int64_t now = absl::ToUnixMillis(absl::Now());
  std::vector<state::Allocation> records;
  uint64_t next = state_.next_allocation_id();
  for (int i = 0; i < req.container_requests_size(); ++i) {
    state::Allocation a;
    a.set_id(++next);
    a.set_resource(resource);
    for (const std::string& id : req.container_requests(i).devices_ids()) a.add_device_ids(id);
    if (i < resp.container_responses_size()) *a.mutable_response() = resp.container_responses(i);
    a.set_backend_api(backend_api);
    a.set_backend_endpoint(backend_endpoint);
    a.set_allocated_unix_ms(now);
    records.push_back(std::move(a));
  }
  // One append and one fdatasync; without a journal, a full snapshot.
  absl::Status s;
  if (journal_ok_) {
    s = journal_.Append(records);
    if (!s.ok()) {
      LOG(ERROR) << "cannot append to the journal " << journal_.path() << ": " << s.message();
      events_->Emit("state_save_failed", {{"path", journal_.path()},
                                          {"error", std::string(s.message())}});
      return s;  // nothing recorded
    }
  }
  for (auto& a : records) *state_.add_allocations() = std::move(a);
  state_.set_next_allocation_id(next);
  if (!journal_ok_ || journal_.records() >= kCompactAfter) {
    s = SaveLocked();
    if (!s.ok() && !journal_ok_) {
      // Nothing durable was written: take the records back.
      for (size_t i = 0; i < records.size(); ++i) state_.mutable_allocations()->RemoveLast();
      state_.set_next_allocation_id(next - records.size());
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status StateKeeper::SetResources(std::vector<state::Resource> resources) {
  std::sort(resources.begin(), resources.end(),
            [](const state::Resource& a, const state::Resource& b) { return a.name() < b.name(); });
  absl::MutexLock lock(&mu_);
  // Compare without the timestamps: only real changes are saved.
  auto key = [](const state::Resource& r) {
    state::Resource c = r;
    c.clear_updated_unix_ms();
    return c.SerializeAsString();
  };
  bool changed = static_cast<int>(resources.size()) != state_.resources_size();
  for (size_t i = 0; !changed && i < resources.size(); ++i) {
    changed = key(resources[i]) != key(state_.resources(static_cast<int>(i)));
  }
  if (!changed) return absl::OkStatus();
  state_.clear_resources();
  const int64_t now = absl::ToUnixMillis(absl::Now());
  for (state::Resource& r : resources) {
    r.set_updated_unix_ms(now);
    *state_.add_resources() = std::move(r);
  }
  return SaveLocked();
}

absl::Status StateKeeper::Release(const std::vector<uint64_t>& ids) {
  if (ids.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto* a = state_.mutable_allocations();
  a->erase(std::remove_if(a->begin(), a->end(),
                          [&](const state::Allocation& x) {
                            return std::find(ids.begin(), ids.end(), x.id()) != ids.end();
                          }),
           a->end());
  return SaveLocked();
}

absl::Status StateKeeper::Annotate(uint64_t id, const std::string& pod_namespace,
                                   const std::string& pod_name, const std::string& container) {
  absl::MutexLock lock(&mu_);
  for (state::Allocation& a : *state_.mutable_allocations()) {
    if (a.id() != id) continue;
    if (a.pod_namespace() == pod_namespace && a.pod_name() == pod_name &&
        a.container() == container) {
      return absl::OkStatus();
    }
    a.set_pod_namespace(pod_namespace);
    a.set_pod_name(pod_name);
    a.set_container(container);
    return SaveLocked();
  }
  return absl::NotFoundError(absl::StrCat("no allocation ", id));
}

bool StateKeeper::HoldsDevice(const std::string& resource, const std::string& id) {
  absl::MutexLock lock(&mu_);
  for (const state::Allocation& a : state_.allocations()) {
    if (a.resource() != resource) continue;
    for (const std::string& d : a.device_ids()) {
      if (d == id) return true;
    }
  }
  return false;
}

int StateKeeper::AllocationCount() {
  absl::MutexLock lock(&mu_);
  return state_.allocations_size();
}

state::State StateKeeper::Snapshot() {
  absl::MutexLock lock(&mu_);
  return state_;
}

}  // namespace dpproxy
