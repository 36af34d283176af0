#include "proxy/state/hold_index.h"

#include "absl/strings/str_cat.h"

namespace dpproxy {

std::string HoldIndex::Key(const std::string& resource, const std::string& id) {
  std::string k = resource;
  k.push_back('\0');
  k += id;
  return k;
}

std::string HoldIndex::HolderOf(const state::Allocation& a) {
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

void HoldIndex::Clear() {
  held_.clear();
  quarantined_.clear();
  by_claim_.clear();
  claim_held_.clear();
  across_.clear();
}

void HoldIndex::Rebuild(const AllocationTable& all) {
  Clear();
  all.ForEach([this](const state::Allocation& a) {
    Add(a);
    AddQuarantined(a);
  });
}

void HoldIndex::RebuildQuarantined(const AllocationTable& all) {
  quarantined_.clear();
  all.ForEach([this](const state::Allocation& a) { AddQuarantined(a); });
}

void HoldIndex::AddQuarantined(const state::Allocation& a) {
  if (!a.quarantined()) return;
  for (const std::string& d : a.device_ids()) quarantined_[Key(a.resource(), d)] = a.id();
}

bool HoldIndex::Add(const state::Allocation& a) {
  for (const std::string& d : a.device_ids()) ++held_[Key(a.resource(), d)];
  if (one_holder_) {
    auto& devices = across_[a.resource()];
    for (const std::string& d : a.device_ids()) {
      Counts& counts = devices[d];
      (a.has_claim() ? counts.claims : counts.others) += 1;
      if (a.has_claim() && a.claim().extended_resource()) ++counts.pod_claims;
    }
  }
  if (a.has_claim()) {
    by_claim_[a.claim().uid()].insert(a.id());
    for (const std::string& d : a.device_ids()) claim_held_[Key(a.resource(), d)].insert(a.id());
  }
  return one_holder_;
}

bool HoldIndex::Remove(const state::Allocation& a) {
  bool across_changed = false;
  if (auto r = across_.find(a.resource()); r != across_.end()) {
    for (const std::string& d : a.device_ids()) {
      auto c = r->second.find(d);
      if (c == r->second.end()) continue;
      (a.has_claim() ? c->second.claims : c->second.others) -= 1;
      if (a.has_claim() && a.claim().extended_resource()) --c->second.pod_claims;
      if (c->second.claims <= 0 && c->second.others <= 0) r->second.erase(c);
    }
    across_changed = true;
  }
  for (const std::string& d : a.device_ids()) {
    auto h = held_.find(Key(a.resource(), d));
    if (h != held_.end() && --h->second == 0) held_.erase(h);
  }
  if (!a.has_claim()) return across_changed;
  for (const std::string& d : a.device_ids()) {
    auto h = claim_held_.find(Key(a.resource(), d));
    if (h == claim_held_.end()) continue;
    h->second.erase(a.id());
    if (h->second.empty()) claim_held_.erase(h);
  }
  auto c = by_claim_.find(a.claim().uid());
  if (c != by_claim_.end()) {
    c->second.erase(a.id());
    if (c->second.empty()) by_claim_.erase(c);
  }
  return across_changed;
}

void HoldIndex::MoveClaim(uint64_t id, const std::string& from_uid, const std::string& to_uid) {
  if (from_uid == to_uid) return;
  if (auto c = by_claim_.find(from_uid); c != by_claim_.end()) {
    c->second.erase(id);
    if (c->second.empty()) by_claim_.erase(c);
  }
  by_claim_[to_uid].insert(id);
}

void HoldIndex::StartInFlight(const state::Allocation& a) {
  for (const std::string& d : a.device_ids()) {
    InFlight& f = in_flight_[Key(a.resource(), d)];
    if (a.has_claim()) {
      ++f.claims;
      f.claim_holder = HolderOf(a);
    } else {
      ++f.others;
    }
  }
}

void HoldIndex::EndInFlight(const state::Allocation& a) {
  for (const std::string& d : a.device_ids()) {
    auto f = in_flight_.find(Key(a.resource(), d));
    if (f == in_flight_.end()) continue;
    (a.has_claim() ? f->second.claims : f->second.others) -= 1;
    if (f->second.claims <= 0 && f->second.others <= 0) in_flight_.erase(f);
  }
}

bool HoldIndex::Holds(const std::string& resource, const std::string& id) const {
  return held_.count(Key(resource, id)) > 0;
}

int HoldIndex::ClaimAllocationCount() const {
  int n = 0;
  for (const auto& [uid, ids] : by_claim_) n += static_cast<int>(ids.size());
  return n;
}

std::map<std::string, HoldIndex::HeldAcross> HoldIndex::HeldAcrossPaths() const {
  std::map<std::string, HeldAcross> out;
  for (const auto& [resource, devices] : across_) {
    HeldAcross& h = out[resource];
    for (const auto& [device, counts] : devices) {
      if (counts.claims > 0) h.by_claims.insert(device);
      if (counts.pod_claims > 0) h.by_pod_claims.insert(device);
      if (counts.others > 0) h.by_pods.insert(device);
    }
  }
  return out;
}

std::optional<HoldIndex::Refusal> HoldIndex::CheckOtherPath(const std::string& resource,
                                                            const std::string& device,
                                                            bool claim,
                                                            const AllocationTable& all) const {
  if (!one_holder_) return std::nullopt;
  const std::string key = Key(resource, device);
  auto c = claim_held_.find(key);
  const size_t by_claims = c == claim_held_.end() ? 0 : c->second.size();
  auto f = in_flight_.find(key);
  const InFlight flying = f == in_flight_.end() ? InFlight() : f->second;
  std::string holder;
  if (!claim && (by_claims > 0 || flying.claims > 0)) {
    state::Allocation a;
    if (by_claims == 0) {
      holder = flying.claim_holder;
    } else if (all.Get(*c->second.rbegin(), &a)) {
      holder = HolderOf(a);
    } else {
      holder = absl::StrCat("allocation ", *c->second.rbegin());
    }
  } else if (claim) {
    auto h = held_.find(key);
    const size_t held = h == held_.end() ? 0 : static_cast<size_t>(h->second);
    if (held <= by_claims && flying.others == 0) return std::nullopt;
    // The newest allocation without a claim that names it: read only on a
    // refusal.
    if (held > by_claims) {
      all.ForEach([&](const state::Allocation& a) {
        if (a.has_claim() || a.resource() != resource) return;
        for (const std::string& d : a.device_ids()) {
          if (d == device) holder = HolderOf(a);
        }
      });
    }
    if (holder.empty()) holder = "an allocation being recorded";
    holder = absl::StrCat(holder, ", a pod of the extended resource");
  } else {
    return std::nullopt;
  }
  Refusal r;
  r.message = absl::StrCat("device ", device, " of ", resource, " is held by ", holder,
                           "; refused: a device has one holder");
  r.holder = std::move(holder);
  return r;
}

std::optional<HoldIndex::Refusal> HoldIndex::CheckForgotten(const std::string& resource,
                                                            const std::string& device,
                                                            const AllocationTable& all) const {
  auto q = quarantined_.find(Key(resource, device));
  if (q == quarantined_.end()) return std::nullopt;
  Refusal r;
  r.holder = absl::StrCat("allocation ", q->second);
  if (state::Allocation a; all.Get(q->second, &a)) r.holder = HolderOf(a);
  r.message = absl::StrCat("device ", device, " of ", resource, " is still in use by ", r.holder,
                           ", which the kubelet lost track of (it counts the device free); "
                           "refused");
  return r;
}

}  // namespace dpproxy
