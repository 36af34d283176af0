// File: allocation_journal.h
//
// What the allocator and DRA's claim preparation need of the journal that
// makes each allocation durable before the kubelet is answered: the narrow
// interfaces they are given, apart from the keeper that implements them
// (state_keeper.h), its storage, snapshots and load.
#ifndef DPPROXY_PROXY_STATE_ALLOCATION_JOURNAL_H_
#define DPPROXY_PROXY_STATE_ALLOCATION_JOURNAL_H_

#include <stdint.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {

// The plugin's side of an allocation, as the journal keeps it.
struct BackendSide {
  std::string api;       // the version it was called in ("v1beta1", ...)
  std::string endpoint;  // its socket
  std::string resource;  // its resource name ("": not known)
  // The request as the plugin got it, if its device IDs differ from the
  // kubelet's (an ID map, compact IDs); nullptr: the same IDs.
  const v1beta1::AllocateRequest* request = nullptr;
  // DRA mode: the claim of each container request (same order); nullptr
  // outside DRA mode.
  const std::vector<state::DraClaim>* claims = nullptr;
};

class AllocationJournal {
 public:
  virtual ~AllocationJournal() = default;
  // Persists one record per container request before the kubelet is
  // answered: `done` runs once the records are durable, or with why they
  // are not (then nothing was recorded). It runs on the calling thread or
  // on the thread that wrote the records' batch, with no lock held, and
  // must not block. kFailedPrecondition (and a `device_held_twice` event)
  // if a device is held by a quarantined allocation: a second live holder
  // is never journaled.
  virtual void RecordAsync(const std::string& resource, const v1beta1::AllocateRequest& req,
                           const v1beta1::AllocateResponse& resp, const BackendSide& backend,
                           std::function<void(absl::Status)> done) = 0;

  // The same in two steps, so that the sync overlaps the plugin's call:
  //
  //   ReserveAsync  while the plugin is called: one RESERVED record per
  //                 container (everything but the response). `durable` runs
  //                 once they are synced (from then on they hold their
  //                 devices like any allocation), or with why not (nothing
  //                 was recorded; the refusals of RecordAsync).
  //   AnswerAsync   once the plugin answered and `durable` ran OK: the
  //                 response (ANSWERED records), and with `claims` (one
  //                 per container, may be null) the DRA claims, which then
  //                 replace the reserved records' (what only the whole
  //                 answer tells: their CDI names and spec). `done` runs once they are
  //                 written, before their sync: a dpproxy crash keeps them,
  //                 and the next sync (their own, or the next append's)
  //                 makes them durable.
  //   Withdraw      instead, if the plugin or the kubelet refused: the
  //                 allocation is forgotten at once and a WITHDRAWN record
  //                 is written (not waited for).
  //
  // What holds a device is never answered before it is durable; only a
  // response can be lost, to a power loss within one sync of its answer.
  struct Reservation {
    uint64_t first_id = 0;  // the containers' allocations: ids first_id...
    int count = 0;          // ...first_id + count - 1
  };
  // `readmission`: a restarted kubelet re-admitting a running container it
  // forgot (before 1.25 it allocates again for one): the request may name
  // devices of forgotten (quarantined) allocations, which keep holding them.
  virtual Reservation ReserveAsync(const std::string& resource,
                                   const v1beta1::AllocateRequest& req,
                                   const BackendSide& backend,
                                   std::function<void(absl::Status)> durable,
                                   bool readmission = false) = 0;
  virtual void AnswerAsync(const Reservation& r, const v1beta1::AllocateResponse& resp,
                           std::function<void(absl::Status)> done,
                           const std::vector<state::DraClaim>* claims = nullptr) = 0;
  virtual void Withdraw(const Reservation& r) = 0;
  // Why a device of `req` may not be had on this path (`claim`: a DRA
  // claim's request) because the other one holds it (SetOneHolderAcrossPaths),
  // or OK. Asked before the plugin is; the reservation asks again.
  virtual absl::Status CheckOtherPath(const std::string& resource,
                                      const v1beta1::AllocateRequest& req, bool claim) {
    return absl::OkStatus();
  }
};

// DRA's claim preparation: the allocations are a claim's, looked up and
// released by claim.
class ClaimJournal : public AllocationJournal {
 public:
  // The allocations of one claim, oldest first (with their responses).
  virtual std::vector<state::Allocation> ClaimAllocations(const std::string& claim_uid) = 0;
  // Every claim with allocations, each with its allocations (oldest first).
  virtual std::map<std::string, std::vector<state::Allocation>> Claims() = 0;
  // RecordAsync, waiting for the outcome.
  virtual absl::Status Record(const std::string& resource, const v1beta1::AllocateRequest& req,
                              const v1beta1::AllocateResponse& resp,
                              const BackendSide& backend) = 0;
  // Forgets allocations (their claims are gone), durably.
  virtual absl::Status Release(const std::vector<uint64_t>& ids) = 0;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_ALLOCATION_JOURNAL_H_
