// File: allocator.h
//
// The one Allocate of a resource, whichever way the kubelet asks for it: a
// device-plugin socket in v1alpha or v1beta1 (kubelet_side/device_plugin/device_plugin_server.h)
// or a DRA claim (dra/claim_preparer.h). Every allocation dpproxy makes
// goes through here, and so obeys the same rules:
//
//   1. the request names only devices the resource lists, each Healthy and
//      once per container, and, where dpproxy serves the kubelet both as
//      device plugins and through DRA, none the other path holds (asked
//      before the plugin is: AllocationJournal::CheckOtherPath, hold_index.h);
//   2. a device held by a container the kubelet forgot is asked about once
//      (its holder may be gone by now), and refused with the holder named
//      if not (Resource::CheckForgotten);
//   3. with no backend connected yet (dpproxy and its plugin restarting
//      together) the call waits for one, at most 10 s;
//   4. the backend is called in its own device IDs with a deadline,
//      cancelled with the caller, while the journal makes the reservation
//      durable (a device held in the journal by a live allocation is never
//      reserved twice);
//   5. PreStartContainer right after, where the side has no per-container
//      start of its own (v1alpha kubelets, DRA) and the backend asks for it;
//   6. the answer is journaled, and only then given.
//
// No thread waits on a call: each step starts the next from the callback
// that ends the one before (the backend's answer on one of gRPC's threads,
// the journal's on its group-commit writer). Only steps 2 and 3 run on a
// thread of their own, and only when they must wait.
//
//   Allocator alloc(&resource, &journal, &telemetry);
//   Allocator::Call call;
//   call.request = req;  // the kubelet's device IDs
//   call.timeout = absl::Seconds(30);
//   call.caller = ctx;   // the kubelet's call: its end cancels this one
//   alloc.Allocate(std::move(call), [](absl::StatusOr<Allocator::Allocated> r) { ... });
#ifndef DPPROXY_PROXY_CORE_ALLOCATOR_H_
#define DPPROXY_PROXY_CORE_ALLOCATOR_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/core/backend.h"
#include "proxy/core/resource.h"
#include "proxy/events/telemetry.h"
#include "proxy/state/allocation_journal.h"
#include "proxy/util/job_threads.h"

namespace dpproxy {

class Allocator {
 public:
  // `journal` (may be null: nothing persists) and `telemetry` (may be
  // null) outlive the allocator, which outlives every call it started.
  Allocator(Resource* resource, AllocationJournal* journal, Telemetry* telemetry);
  // Joins the threads its calls started (a wait for a backend, a check
  // against pod-resources): they may still be inside the journal or the
  // resource after their call was answered. A wait ends with its caller's
  // cancellation, or within 10 s.
  ~Allocator();

  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  Resource* resource() const { return resource_; }

  struct Call {
    // One container request per container (or DRA claim request), in the
    // kubelet's device IDs.
    v1beta1::AllocateRequest request;
    // The limit of the whole call to the backend, PreStartContainer
    // included.
    absl::Duration timeout = absl::Seconds(30);
    // The kubelet's call this one serves (may be null): its cancellation
    // ends a wait for a backend and cancels the backend's call.
    const grpc::ServerContextBase* caller = nullptr;
    // The kubelet's side, for the metrics' kubelet_api label ("v1beta1",
    // "v1alpha2", "dra").
    std::string kubelet_api = "v1beta1";
    // Call PreStartContainer once per container right after the Allocate
    // when the backend requires it: the kubelet side never will.
    bool pre_start = false;
    // The kubelet may be re-admitting a running container it forgot
    // (Resource::CheckForgotten).
    bool readmission_possible = false;
    // DRA: the claim of each container request (journal records carry
    // them); empty otherwise.
    std::vector<state::DraClaim> claims;
    // false: the answer is journaled before `done` (the device-plugin
    // sides). true: `done` gets the reservation, durable but unanswered,
    // and the caller ends it with Commit or Withdraw (DRA, whose answer
    // covers several resources).
    bool defer_commit = false;
  };
  struct Allocated {
    v1beta1::AllocateResponse response;
    // The backend that answered (its options, its API).
    std::shared_ptr<Backend> backend;
    // defer_commit only: what Commit or Withdraw ends.
    AllocationJournal::Reservation reservation;
  };
  using Done = std::function<void(absl::StatusOr<Allocated>)>;

  // Starts one allocation; `done` runs once, on any thread, and must not
  // block. Errors, as the kubelet gets them:
  //   kInvalidArgument     a device unknown, named twice, a request empty;
  //   kFailedPrecondition  a device not Healthy, or held by a running
  //                        container (its holder named);
  //   kUnavailable         no backend came, or the allocation cannot be
  //                        persisted (it is refused, as a kubelet refuses
  //                        admission when its checkpoint cannot be written);
  //   the backend's own    its error, naming it and the call.
  void Allocate(Call call, Done done);

  // For a deferred commit: the answer journaled (`claims`, if given,
  // replace the reserved records' claims: what only the whole answer
  // tells, such as CDI names), and then `done`; or the reservation given
  // up.
  void Commit(const AllocationJournal::Reservation& r, const v1beta1::AllocateResponse& response,
              const std::vector<state::DraClaim>* claims, std::function<void(absl::Status)> done);
  void Withdraw(const AllocationJournal::Reservation& r);

  // Runs `then` with the resource's backend: at once if one is connected;
  // otherwise from a thread of its own that waits for one (at most 10 s,
  // within `timeout`) in short steps, so that a caller that gives up ends
  // the wait. Null if none came (NoBackend() says why). For every call
  // the kubelet makes of a backend, Allocate's among them.
  void WithBackend(const grpc::ServerContextBase* caller, absl::Duration timeout,
                   std::function<void(std::shared_ptr<Backend>)> then);
  absl::Status NoBackend() const;

  // Times one call to the backend (side=backend in the metrics), started
  // at `start`; for the other calls the kubelet makes of a backend too.
  void ObserveBackendCall(const char* method, absl::string_view kubelet_api, const Backend& b,
                          const absl::Status& s, absl::Time start) const;

  // Allocates refused because they named a device a running container the
  // kubelet forgot still holds.
  int64_t refused_held() const { return refused_held_.load(); }

  // Implementation, for the call in the .cc file.
  class Flow;
  AllocationJournal* journal() const { return journal_; }
  Telemetry* telemetry() const { return telemetry_; }
  void NoteRefusedHeld() { ++refused_held_; }

 private:
  Resource* const resource_;
  AllocationJournal* const journal_;
  Telemetry* const telemetry_;
  std::atomic<int64_t> refused_held_{0};
  // Waits for a backend, off gRPC's threads; joined by the destructor.
  JobThreads jobs_;
};

// A journal's refusal as the kubelet is told it: kFailedPrecondition (a
// device held twice) as it is, anything else kUnavailable naming the
// resource.
absl::Status JournalRefusal(const absl::Status& s, const std::string& resource);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CORE_ALLOCATOR_H_
