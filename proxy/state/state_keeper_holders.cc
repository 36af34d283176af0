// StateKeeper's side of the hold index (hold_index.h): the index kept in
// step with the allocations under the keeper's lock, its refusals reported,
// and what readers ask of it.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proxy/state/state_keeper.h"

namespace dpproxy {

void StateKeeper::SetOneHolderAcrossPaths(bool on) {
  absl::MutexLock lock(&mu_);
  holds_.SetOneHolderAcrossPaths(on);
  one_holder_set_ = on;
  RebuildIndexLocked();
  HeldAcrossChangedLocked();
}

StateKeeper::Kinds StateKeeper::AllocationKinds() {
  Kinds k;
  absl::MutexLock lock(&mu_);
  k.claims = holds_.ClaimAllocationCount();
  k.others = static_cast<int>(allocations_.size()) - k.claims;
  return k;
}

std::map<std::string, StateKeeper::HeldAcross> StateKeeper::HeldAcrossPaths() {
  absl::MutexLock lock(&mu_);
  return holds_.HeldAcrossPaths();
}

void StateKeeper::HeldAcrossChangedLocked() {
  ++held_across_version_;
  if (held_across_observer_) held_across_observer_();
}

absl::Status StateKeeper::CheckOtherPath(const std::string& resource,
                                         const v1beta1::AllocateRequest& req, bool claim) {
  if (!one_holder_set_.load()) return absl::OkStatus();  // no lock on every Allocate
  absl::MutexLock lock(&mu_);
  return CheckOtherPathLocked(resource, req, claim);
}

absl::Status StateKeeper::CheckOtherPathLocked(const std::string& resource,
                                               const v1beta1::AllocateRequest& req,
                                               bool claim) {
  if (!holds_.one_holder_across_paths()) return absl::OkStatus();
  for (const auto& c : req.container_requests()) {
    for (const std::string& id : c.devices_ids()) {
      if (auto r = holds_.CheckOtherPath(resource, id, claim, allocations_)) {
        return Refuse(resource, id, *r, claim);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status StateKeeper::Refuse(const std::string& resource, const std::string& device,
                                 const HoldIndex::Refusal& r, bool claim) {
  events_->Emit("device_held_twice", {{"resource", resource},
                                      {"device", device},
                                      {"first", r.holder},
                                      {"second", claim ? "refused claim" : "refused Allocate"}});
  return absl::FailedPreconditionError(r.message);
}

absl::Status StateKeeper::CheckRecordableLocked(const std::string& resource,
                                                const v1beta1::AllocateRequest& req, bool claim,
                                                bool readmission) {
  if (handed_over_) return HandedOverError();
  if (!writer_.open()) return absl::FailedPreconditionError("the allocation journal is not open");
  if (absl::Status s = CheckOtherPathLocked(resource, req, claim); !s.ok()) return s;
  if (readmission) return absl::OkStatus();
  // A pod the kubelet lost track of may still hold these devices.
  for (const auto& c : req.container_requests()) {
    for (const std::string& id : c.devices_ids()) {
      if (auto r = holds_.CheckForgotten(resource, id, allocations_)) {
        return Refuse(resource, id, *r, /*claim=*/false);
      }
    }
  }
  return absl::OkStatus();
}

void StateKeeper::RebuildIndexLocked() {
  holds_.Rebuild(allocations_);
  if (holds_.one_holder_across_paths()) HeldAcrossChangedLocked();
  allocation_count_ = static_cast<int>(allocations_.size());
}

void StateKeeper::IndexLocked(const state::Allocation& a) {
  if (holds_.Add(a)) HeldAcrossChangedLocked();
}

void StateKeeper::UnindexLocked(const state::Allocation& a) {
  if (holds_.Remove(a)) HeldAcrossChangedLocked();
}

bool StateKeeper::HoldsDevice(const std::string& resource, const std::string& id) {
  absl::MutexLock lock(&mu_);
  return holds_.Holds(resource, id);
}

std::vector<state::Allocation> StateKeeper::ClaimAllocations(const std::string& claim_uid) {
  std::vector<state::Allocation> out;
  absl::MutexLock lock(&mu_);
  auto c = holds_.claims().find(claim_uid);
  if (c == holds_.claims().end()) return out;
  for (uint64_t id : c->second) {  // ids grow with age: oldest first
    out.emplace_back();
    if (!allocations_.Get(id, &out.back())) out.pop_back();
  }
  return out;
}

std::map<std::string, std::vector<state::Allocation>> StateKeeper::Claims() {
  std::map<std::string, std::vector<state::Allocation>> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [uid, ids] : holds_.claims()) {
    std::vector<state::Allocation>& held = out[uid];
    for (uint64_t id : ids) {
      held.emplace_back();
      if (!allocations_.Get(id, &held.back())) held.pop_back();
    }
  }
  return out;
}

}  // namespace dpproxy
