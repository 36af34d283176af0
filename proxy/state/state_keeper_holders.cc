// StateKeeper's index of who holds which device (state_keeper.h), across
// the device-plugin and DRA paths, and the checks a new record passes
// against it: one holder per device, whichever path it came by.
#include "proxy/state/state_keeper.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <glog/logging.h>

#include <stdio.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "proxy/state/allocation_response.h"
#include "proxy/util/buffers.h"
#include "proxy/util/files.h"
#include "proxy/util/thread_name.h"

namespace dpproxy {

// Who holds an allocation, as a refusal names it.
std::string StateKeeper::HolderOf(const state::Allocation& a) {
  if (a.has_claim()) {
    return absl::StrCat("DRA claim ", a.claim().namespace_(), "/", a.claim().name(), " (UID ",
                        a.claim().uid(), ")");
  }
  if (!a.pod_name().empty()) {
    return absl::StrCat("pod ", a.pod_namespace(), "/", a.pod_name(), " container ",
                        a.container());
  }
  if (!a.pod_uid().empty()) return absl::StrCat("a container of pod UID ", a.pod_uid());
  return absl::StrCat("allocation ", a.id());
}

void StateKeeper::SetOneHolderAcrossPaths(bool on) {
  absl::MutexLock lock(&mu_);
  one_holder_ = on;
  one_holder_set_ = on;
  RebuildIndexLocked();
  HeldAcrossChangedLocked();
}

StateKeeper::Kinds StateKeeper::AllocationKinds() {
  Kinds k;
  absl::MutexLock lock(&mu_);
  for (const auto& [uid, ids] : by_claim_) k.claims += static_cast<int>(ids.size());
  k.others = static_cast<int>(allocations_.size()) - k.claims;
  return k;
}

std::map<std::string, StateKeeper::HeldAcross> StateKeeper::HeldAcrossPaths() {
  std::map<std::string, HeldAcross> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [resource, devices] : both_held_) {
    HeldAcross& h = out[resource];
    for (const auto& [device, counts] : devices) {
      if (counts.claims > 0) h.by_claims.insert(device);
      if (counts.pod_claims > 0) h.by_pod_claims.insert(device);
      if (counts.others > 0) h.by_pods.insert(device);
    }
  }
  return out;
}

void StateKeeper::HeldAcrossChangedLocked() {
  ++held_across_version_;
  if (held_across_observer_) held_across_observer_();
}

absl::Status StateKeeper::CheckOtherPath(const std::string& resource,
                                         const v1beta1::AllocateRequest& req, bool claim) {
  if (!one_holder_set_.load()) return absl::OkStatus();  // no lock on every Allocate
  absl::MutexLock lock(&mu_);
  if (!one_holder_) return absl::OkStatus();
  for (const auto& c : req.container_requests()) {
    for (const std::string& id : c.devices_ids()) {
      if (absl::Status s = CheckOtherPathLocked(resource, id, claim); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status StateKeeper::CheckOtherPathLocked(const std::string& resource,
                                               const std::string& device, bool claim) {
  const std::string key = HeldKey(resource, device);
  auto c = claim_held_.find(key);
  const size_t by_claims = c == claim_held_.end() ? 0 : c->second.size();
  auto f = in_flight_.find(key);
  const InFlight flying = f == in_flight_.end() ? InFlight() : f->second;
  std::string holder;
  if (!claim && (by_claims > 0 || flying.claims > 0)) {
    state::Allocation a;
    if (by_claims == 0) {
      holder = flying.claim_holder;
    } else if (allocations_.Get(*c->second.rbegin(), &a)) {
      holder = HolderOf(a);
    } else {
      holder = absl::StrCat("allocation ", *c->second.rbegin());
    }
  } else if (claim) {
    auto h = held_.find(key);
    const size_t held = h == held_.end() ? 0 : static_cast<size_t>(h->second);
    if (held <= by_claims && flying.others == 0) return absl::OkStatus();
    // The newest allocation without a claim that names it: read only on a
    // refusal.
    if (held > by_claims) {
      allocations_.ForEach([&](const state::Allocation& a) {
        if (a.has_claim() || a.resource() != resource) return;
        for (const std::string& d : a.device_ids()) {
          if (d == device) holder = HolderOf(a);
        }
      });
    }
    if (holder.empty()) holder = "an allocation being recorded";
    holder = absl::StrCat(holder, ", a pod of the extended resource");
  } else {
    return absl::OkStatus();
  }
  events_->Emit("device_held_twice",
                {{"resource", resource},
                 {"device", device},
                 {"first", holder},
                 {"second", claim ? "refused claim" : "refused Allocate"}});
  return absl::FailedPreconditionError(
      absl::StrCat("device ", device, " of ", resource, " is held by ", holder,
                   "; refused: a device has one holder"));
}

absl::Status StateKeeper::CheckRecordableLocked(const std::string& resource,
                                                const v1beta1::AllocateRequest& req, bool claim,
                                                bool readmission) {
  if (handed_over_) return HandedOverError();
  if (!journal_ok_) return absl::FailedPreconditionError("the allocation journal is not open");
  if (one_holder_) {
    for (const auto& c : req.container_requests()) {
      for (const std::string& id : c.devices_ids()) {
        if (absl::Status s = CheckOtherPathLocked(resource, id, claim); !s.ok()) return s;
      }
    }
  }
  if (readmission) return absl::OkStatus();
  // A pod the kubelet lost track of may still hold these devices.
  for (const auto& c : req.container_requests()) {
    for (const std::string& id : c.devices_ids()) {
      auto q = quarantined_held_.find(HeldKey(resource, id));
      if (q == quarantined_held_.end()) continue;
      std::string holder = absl::StrCat("allocation ", q->second);
      if (state::Allocation a; allocations_.Get(q->second, &a)) holder = HolderOf(a);
      events_->Emit("device_held_twice", {{"resource", resource},
                                          {"device", id},
                                          {"first", holder},
                                          {"second", "refused Allocate"}});
      return absl::FailedPreconditionError(absl::StrCat(
          "device ", id, " of ", resource, " is still in use by ", holder,
          ", which the kubelet lost track of (it counts the device free); refused"));
    }
  }
  return absl::OkStatus();
}

void StateKeeper::RebuildIndexLocked() {
  held_.clear();
  quarantined_held_.clear();
  by_claim_.clear();
  claim_held_.clear();
  both_held_.clear();
  allocations_.ForEach([this](const state::Allocation& a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    IndexLocked(a);
    if (!a.quarantined()) return;
    for (const std::string& d : a.device_ids()) quarantined_held_[HeldKey(a.resource(), d)] = a.id();
  });
  allocation_count_ = static_cast<int>(allocations_.size());
}

void StateKeeper::RebuildQuarantineIndexLocked() {
  quarantined_held_.clear();
  allocations_.ForEach([this](const state::Allocation& a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (!a.quarantined()) return;
    for (const std::string& d : a.device_ids()) quarantined_held_[HeldKey(a.resource(), d)] = a.id();
  });
}

void StateKeeper::IndexLocked(const state::Allocation& a) {
  for (const std::string& d : a.device_ids()) ++held_[HeldKey(a.resource(), d)];
  if (one_holder_) {
    auto& devices = both_held_[a.resource()];
    for (const std::string& d : a.device_ids()) {
      HeldCounts& counts = devices[d];
      (a.has_claim() ? counts.claims : counts.others) += 1;
      if (a.has_claim() && a.claim().extended_resource()) ++counts.pod_claims;
    }
    HeldAcrossChangedLocked();
  }
  if (!a.has_claim()) return;
  by_claim_[a.claim().uid()].insert(a.id());
  for (const std::string& d : a.device_ids()) claim_held_[HeldKey(a.resource(), d)].insert(a.id());
}

void StateKeeper::UnindexLocked(const state::Allocation& a) {
  if (auto r = both_held_.find(a.resource()); r != both_held_.end()) {
    for (const std::string& d : a.device_ids()) {
      auto c = r->second.find(d);
      if (c == r->second.end()) continue;
      (a.has_claim() ? c->second.claims : c->second.others) -= 1;
      if (a.has_claim() && a.claim().extended_resource()) --c->second.pod_claims;
      if (c->second.claims <= 0 && c->second.others <= 0) r->second.erase(c);
    }
    HeldAcrossChangedLocked();
  }
  for (const std::string& d : a.device_ids()) {
    auto h = held_.find(HeldKey(a.resource(), d));
    if (h != held_.end() && --h->second == 0) held_.erase(h);
  }
  if (!a.has_claim()) return;
  for (const std::string& d : a.device_ids()) {
    auto h = claim_held_.find(HeldKey(a.resource(), d));
    if (h == claim_held_.end()) continue;
    h->second.erase(a.id());
    if (h->second.empty()) claim_held_.erase(h);
  }
  auto c = by_claim_.find(a.claim().uid());
  if (c == by_claim_.end()) return;
  c->second.erase(a.id());
  if (c->second.empty()) by_claim_.erase(c);
}

bool StateKeeper::HoldsDevice(const std::string& resource, const std::string& id) {
  absl::MutexLock lock(&mu_);
  return held_.count(HeldKey(resource, id)) > 0;
}

std::vector<state::Allocation> StateKeeper::ClaimAllocations(const std::string& claim_uid) {
  std::vector<state::Allocation> out;
  absl::MutexLock lock(&mu_);
  auto c = by_claim_.find(claim_uid);
  if (c == by_claim_.end()) return out;
  for (uint64_t id : c->second) {  // ids grow with age: oldest first
    out.emplace_back();
    if (!allocations_.Get(id, &out.back())) out.pop_back();
  }
  return out;
}

std::map<std::string, std::vector<state::Allocation>> StateKeeper::Claims() {
  std::map<std::string, std::vector<state::Allocation>> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [uid, ids] : by_claim_) {
    std::vector<state::Allocation>& held = out[uid];
    for (uint64_t id : ids) {
      held.emplace_back();
      if (!allocations_.Get(id, &held.back())) held.pop_back();
    }
  }
  return out;
}

}  // namespace dpproxy
