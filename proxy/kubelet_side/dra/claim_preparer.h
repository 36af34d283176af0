// File: claim_preparer.h
//
// NodePrepareResources and NodeUnprepareResources for one claim, with a
// device plugin behind (kubernetes/kubelet pkg/apis/dra; KEP-4381; docs/dra.md):
//
//   1. read the ResourceClaim from the API server and check its UID (the
//      kubelet sends only the reference);
//   2. take the allocation results of our driver; each names a pool (one
//      per resource, resource_slices.h) and a device (its DRA name);
//   3. per resource, one Allocate: one container request per claim request,
//      with the device plugin's IDs; then PreStartContainer right away
//      where the plugin requires it (DRA has no per-container start);
//   4. write the claim's CDI spec (one CDI device per request, cdi_spec.h)
//      and answer each device with its CDI names.
//
// Prepared claims are journaled (allocation_journal.h) before the answer, as
// allocations that carry the claim (state.proto DraClaim): one per claim
// request and resource, with what the kubelet was answered and the claim's
// CDI spec. A repeated prepare (after a kubelet or dpproxy restart) answers
// the same without calling the plugin again, and writes the spec again if
// it is gone (a reboot empties /var/run/cdi while the kubelet still counts
// the claim prepared). The devices a claim holds are held in the journal
// as any allocation's. Unprepare removes the spec and the allocations and
// succeeds when there is nothing to remove. A dpproxy killed mid-prepare
// journaled nothing of that claim: the kubelet prepares it again.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DRA_CLAIM_PREPARER_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DRA_CLAIM_PREPARER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/core/allocator.h"
#include "proxy/core/backend.h"
#include "proxy/kube/kube_client.h"
#include "proxy/state/allocation_journal.h"
#include "proxy/translate/translate.h"

namespace dpproxy {

struct ClaimRef {
  std::string namespace_;
  std::string name;
  std::string uid;
};

// What the kubelet names a claim by, checked before it goes into a path or
// a URL: the UID as the API server makes them (8-4-4-4-12 hexadecimal
// digits), the namespace a DNS label, the name a DNS subdomain.
// kInvalidArgument naming the field and its (quoted, bounded) value.
absl::Status ValidateClaimRef(const ClaimRef& claim);

// A ResourceClaim as the API server answers it, read after its fields are
// checked by type (a wrong one fails with its path). Exposed for the fuzzer.
struct ClaimFromApi {
  struct Result {
    std::string request, driver, pool, device;
  };
  std::string uid;
  // Made by the scheduler for a pod's extended-resource request
  // (metadata.annotations["resource.kubernetes.io/extended-resource-claim"]
  // is "true").
  bool extended_resource = false;
  bool allocated = false;  // status.allocation.devices.results is there
  std::vector<Result> results;
};
absl::StatusOr<ClaimFromApi> ParseClaim(const nlohmann::json& claim);

struct PreparedClaimDevice {
  std::vector<std::string> requests;
  std::string pool;
  std::string device;
  std::vector<std::string> cdi_ids;
};

// One resource dpproxy publishes, as a prepare needs it.
struct BridgedResource {
  std::string resource;              // the device plugin's resource name
  std::shared_ptr<Backend> backend;  // null: no plugin connected now
  std::vector<std::string> device_ids;
  // Every allocation of the resource goes through it (allocator.h).
  Allocator* allocator = nullptr;
};

// Why DRA loses a kind of Loss ("annotations", "prestart_timing",
// "preferred_allocation"), for the one log line per resource.
std::string DraLossReason(const std::string& kind);

class ClaimPreparer {
 public:
  struct Options {
    std::string driver;
    std::string node;
    // The resource.k8s.io version to read claims at ("resource.k8s.io/v1"),
    // asked at each new prepare: found once the API server answers.
    std::function<absl::StatusOr<std::string>()> api_version = [] {
      return absl::StatusOr<std::string>("resource.k8s.io/v1");
    };
    std::string cdi_dir = "/var/run/cdi";
    // Prepared claims are journaled here (nullptr: kept in memory only).
    ClaimJournal* journal = nullptr;
    // Where a dpproxy before the journal kept one file per prepared claim
    // (<state_dir>/dra-claims/<uid>.json): MigrateClaimFiles moves them in.
    std::string claim_files_dir;
    absl::Duration backend_timeout = absl::Seconds(30);
    // What DRA cannot carry of a resource's answers, per prepare
    // (DraLossReason says why for each kind).
    std::function<void(const std::string& resource, const Loss& loss)> on_loss;
  };
  // The resource whose pool has this name (resource_slices.h PoolName), if
  // dpproxy publishes it.
  using ResourceByPool = std::function<std::optional<BridgedResource>(const std::string& pool)>;

  ClaimPreparer(Options options, KubeClient* client, ResourceByPool resources);

  // The devices of one claim with their CDI names, or why not: the
  // message goes into the claim's error for the kubelet. `caller` (may be
  // null): the kubelet's call, whose end cancels the plugin's calls.
  absl::StatusOr<std::vector<PreparedClaimDevice>> Prepare(
      const ClaimRef& claim, const grpc::ServerContextBase* caller = nullptr);
  absl::Status Unprepare(const ClaimRef& claim);

  // At start, before RestoreSpecs: journals the claims of the files in
  // claim_files_dir and removes the files (each once its records are
  // durable). A file that cannot be read is left in place and logged.
  // Returns how many claims it moved.
  absl::StatusOr<int> MigrateClaimFiles();

  // At start: releases the claims whose prepare never finished (reserved
  // in the journal, never answered), and writes the CDI spec of every
  // journaled claim whose spec is gone. After a reboot the CDI directory (tmpfs) is empty while the
  // kubelet may still count those claims prepared and not prepare them
  // again (kubernetes#141433). Returns how many it wrote.
  absl::StatusOr<int> RestoreSpecs();

  // Claims prepared and not unprepared: remembered at start, plus those
  // prepared since.
  int prepared_claims();

  // The limit of each call to a plugin, from the next on (a SIGHUP may
  // change it).
  void SetBackendTimeout(absl::Duration d) { backend_timeout_ns_ = absl::ToInt64Nanoseconds(d); }


 private:
  // One pool's share of a claim: its resource, one container request per
  // claim request (the plugin's IDs) with the claim record of each, and
  // what its allocator answered.
  struct PoolPart {
    std::string pool;
    BridgedResource res;
    v1beta1::AllocateRequest request;
    std::vector<state::DraClaim> claims;
    Allocator::Allocated allocated;
  };
  absl::StatusOr<std::vector<PreparedClaimDevice>> PrepareNew(
      const ClaimRef& claim, const grpc::ServerContextBase* caller);
  // The claim as the API server has it, checked against the kubelet's.
  absl::StatusOr<ClaimFromApi> ReadClaim(const ClaimRef& claim);
  absl::StatusOr<std::vector<PoolPart>> PlanParts(const ClaimRef& c, const ClaimFromApi& claim);
  // Allocates a part, reserved in the journal and not answered there.
  absl::Status AllocatePart(PoolPart* part, const grpc::ServerContextBase* caller);
  // Names each request's CDI device, adds the names (and, to the first
  // record, the spec) to the parts' claims; returns the spec.
  absl::StatusOr<std::string> NameCdiDevices(const ClaimRef& c, std::vector<PoolPart>* parts);
  // Journals every part's answer; on a failure withdraws the rest.
  absl::Status CommitParts(std::vector<PoolPart>* parts);
  void TellLosses(const std::vector<PoolPart>& parts);
  // Whether every record of a claim was answered (none only reserved).
  static bool Complete(const std::vector<state::Allocation>& allocations);
  absl::Status ReleaseClaim(const std::string& uid);
  // Holds one claim for the caller's scope: calls for one claim run one at
  // a time (they write its files), calls for different claims at once (a
  // slow plugin must not hold up every pod starting on the node).
  class ClaimTurn {
   public:
    ClaimTurn(ClaimPreparer* p, const std::string& uid);
    ~ClaimTurn();

   private:
    ClaimPreparer* const p_;
    const std::string uid_;
  };
  // The answer (and the spec, if gone) of a claim journaled before.
  absl::StatusOr<std::vector<PreparedClaimDevice>> Remembered(
      const ClaimRef& claim, const std::vector<state::Allocation>& allocations);
  absl::Status MigrateClaimFile(const std::string& uid, const nlohmann::json& record);
  void Held(const std::string& uid, bool held);

  const Options options_;
  std::atomic<int64_t> backend_timeout_ns_;
  KubeClient* const client_;
  const ResourceByPool resources_;
  absl::Mutex mu_;
  std::set<std::string> busy_ ABSL_GUARDED_BY(mu_);      // claim UIDs being worked on
  std::set<std::string> prepared_ ABSL_GUARDED_BY(mu_);  // claim UIDs prepared
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DRA_CLAIM_PREPARER_H_
