// File: hold_index.h
//
// Who holds which device: the allocations a journal keeps, indexed by the
// devices they name, by path (a DRA claim's, or a device plugin's without
// one), by claim, and the forgotten (quarantined) ones apart; and the
// records on their way to the journal. Two refusals are read from it:
//
//   - one holder across paths: with SetOneHolderAcrossPaths, a device a
//     claim holds is refused to an allocation without a claim, and one an
//     allocation without a claim holds is refused to a claim;
//   - a device a forgotten allocation still holds (its pod runs, and the
//     kubelet counts the device free) is refused to a new allocation.
//
// No I/O, no lock, no events: its owner (StateKeeper) guards it with its
// own lock, reports refusals and counts changes.
#ifndef DPPROXY_PROXY_STATE_HOLD_INDEX_H_
#define DPPROXY_PROXY_STATE_HOLD_INDEX_H_

#include <stdint.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "proxy/state/allocation_table.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {

class HoldIndex {
 public:
  // Whether each device has one holder across the device-plugin and DRA
  // paths. Changing it empties the across-paths counts: Rebuild then.
  void SetOneHolderAcrossPaths(bool on) { one_holder_ = on; }
  bool one_holder_across_paths() const { return one_holder_; }

  // Everything again from `all`.
  void Rebuild(const AllocationTable& all);
  // The forgotten allocations alone again (which are quarantined changed).
  void RebuildQuarantined(const AllocationTable& all);
  // `a` joined, or left, the journal's allocations. Each returns whether
  // the devices held across paths (HeldAcrossPaths) changed.
  bool Add(const state::Allocation& a);
  bool Remove(const state::Allocation& a);
  // Allocation `id`'s claim changed from `from_uid` to `to_uid` (an answer
  // replaced the reservation's claim).
  void MoveClaim(uint64_t id, const std::string& from_uid, const std::string& to_uid);
  // `a` is on its way to the journal (queued, not yet written): it holds
  // its devices against the other path already, so that two paths asking
  // for one device at the same instant cannot both be recorded; until
  // EndInFlight.
  void StartInFlight(const state::Allocation& a);
  void EndInFlight(const state::Allocation& a);

  // Whether an allocation of `resource` names device `id`.
  bool Holds(const std::string& resource, const std::string& id) const;
  // Whether any forgotten allocation holds a device.
  bool AnyQuarantined() const { return !quarantined_.empty(); }
  // Claim UID -> the ids of its allocations (ids grow with age: oldest
  // first).
  const std::map<std::string, std::set<uint64_t>>& claims() const { return by_claim_; }
  // How many allocations DRA claims made.
  int ClaimAllocationCount() const;

  // With one holder across paths, each resource with allocations: the
  // devices DRA claims hold (by_claims; by_pod_claims those of claims the
  // scheduler made for pods' extended-resource requests, a subset), and
  // those allocations without a claim hold. A resource stays listed, with
  // nothing held, once its last allocation goes.
  struct HeldAcross {
    std::set<std::string> by_claims, by_pod_claims, by_pods;
  };
  std::map<std::string, HeldAcross> HeldAcrossPaths() const;

  // Why a device may not be had: who holds it, as a refusal names it.
  struct Refusal {
    std::string holder;   // "DRA claim ns/name (UID u)", "pod ns/p container c", ...
    std::string message;  // the whole refusal, naming device, resource and holder
  };
  // One holder across paths, for device `device` of `resource` wanted by
  // a claim (`claim`) or by an allocation without one. `all` names the
  // holder. Nothing when it may be had (or the rule is off).
  std::optional<Refusal> CheckOtherPath(const std::string& resource, const std::string& device,
                                        bool claim, const AllocationTable& all) const;
  // A forgotten allocation's device, wanted by a new allocation.
  std::optional<Refusal> CheckForgotten(const std::string& resource, const std::string& device,
                                        const AllocationTable& all) const;

  // Who holds an allocation, as a refusal names it.
  static std::string HolderOf(const state::Allocation& a);

 private:
  // The key of a device: resource, NUL, device ID.
  static std::string Key(const std::string& resource, const std::string& id);
  void Clear();
  void AddQuarantined(const state::Allocation& a);

  bool one_holder_ = false;
  // Key -> how many allocations name it.
  std::unordered_map<std::string, int> held_;
  // Key -> the forgotten allocation that names it.
  std::unordered_map<std::string, uint64_t> quarantined_;
  // Claim UID -> the ids of its allocations.
  std::map<std::string, std::set<uint64_t>> by_claim_;
  // Key -> the claim allocations that name it (a subset of held_'s count:
  // the rest are allocations without a claim).
  std::unordered_map<std::string, std::set<uint64_t>> claim_held_;
  // Records queued and not yet written, with one holder across paths.
  struct InFlight {
    int claims = 0, others = 0;
    std::string claim_holder;  // the latest claim's, as a refusal names it
  };
  std::unordered_map<std::string, InFlight> in_flight_;
  // With one holder across paths: resource -> device -> how many claims
  // (and of those, extended-resource claims) and other allocations name it.
  struct Counts {
    int claims = 0, pod_claims = 0, others = 0;
  };
  std::map<std::string, std::map<std::string, Counts>> across_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_HOLD_INDEX_H_
