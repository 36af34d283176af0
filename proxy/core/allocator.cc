#include "proxy/core/allocator.h"

#include <algorithm>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <utility>

#include <grpcpp/server_context.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/rpc/grpc_status.h"

namespace dpproxy {
namespace {

// How long a call that finds no backend waits for one (at most the
// call's timeout): after dpproxy and its plugin restart together, the
// kubelet may be shown the remembered devices before the plugin has
// registered again, and a pod admitted then must not fail for it.
constexpr absl::Duration kBackendWait = absl::Seconds(10);

// Rule 1: the request names only devices the resource lists, each Healthy
// and once per container.
absl::Status CheckRequest(Resource* r, const v1beta1::AllocateRequest& req) {
  if (req.container_requests_size() == 0) {
    return absl::InvalidArgumentError("AllocateRequest has no container requests");
  }
  for (int i = 0; i < req.container_requests_size(); ++i) {
    const auto& c = req.container_requests(i);
    if (c.devices_ids_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat("container request ", i + 1,
                                                     " names no device"));
    }
    std::unordered_set<std::string_view> seen;
    for (const std::string& id : c.devices_ids()) {
      std::optional<std::string> health = r->DeviceHealth(id);
      if (!health.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown device ID ", GoQuote(id), " for resource ", r->name()));
      }
      if (c.devices_ids_size() > 1 && !seen.insert(id).second) {
        return absl::InvalidArgumentError(absl::StrCat("container request ", i + 1,
                                                       " names device ", GoQuote(id), " twice"));
      }
      if (*health != kHealthy) {
        return absl::FailedPreconditionError(absl::StrCat("device ", GoQuote(id),
                                                          " of resource ", r->name(), " is ",
                                                          *health,
                                                          "; dpproxy does not allocate it"));
      }
    }
  }
  return absl::OkStatus();
}

bool SameDeviceIds(const v1beta1::AllocateRequest& a, const v1beta1::AllocateRequest& b) {
  if (a.container_requests_size() != b.container_requests_size()) return false;
  for (int i = 0; i < a.container_requests_size(); ++i) {
    const auto& x = a.container_requests(i).devices_ids();
    const auto& y = b.container_requests(i).devices_ids();
    if (!std::equal(x.begin(), x.end(), y.begin(), y.end())) return false;
  }
  return true;
}

// The request with the kubelet's device IDs renamed to the backend's.
v1beta1::AllocateRequest ToBackendIds(Resource* r, const v1beta1::AllocateRequest& req) {
  v1beta1::AllocateRequest out = req;
  for (auto& c : *out.mutable_container_requests()) {
    for (auto& id : *c.mutable_devices_ids()) id = r->ToBackendId(id);
  }
  return out;
}

}  // namespace

absl::Status JournalRefusal(const absl::Status& s, const std::string& resource) {
  if (s.ok() || s.code() == absl::StatusCode::kFailedPrecondition) return s;
  return absl::UnavailableError(absl::StrCat("dpproxy cannot persist the allocation for ",
                                             resource, ", so it refuses it: ", s.message()));
}

// One allocation on its way through the steps of allocator.h; deletes
// itself once `done` has run.
class Allocator::Flow {
 public:
  Flow(Allocator* a, Call call, Done done)
      : a_(a),
        res_(a->resource()),
        call_(std::move(call)),
        done_(std::move(done)),
        deadline_(absl::Now() + call_.timeout) {}

  void Begin() {
    if (absl::Status s = CheckRequest(res_, call_.request); !s.ok()) return Finish(s);
    if (!forgotten_checked_ && NamesForgotten()) return CheckForgotten();
    WithBackend();
  }

 private:
  // Rule 2, on a thread of its own (it may ask the kubelet's pod-resources
  // API), once.
  void CheckForgotten() {
    forgotten_checked_ = true;
    std::vector<std::vector<std::string>> per_container;
    for (const auto& c : call_.request.container_requests()) {
      per_container.emplace_back(c.devices_ids().begin(), c.devices_ids().end());
    }
    a_->jobs_.Spawn([this, per_container = std::move(per_container)] {
      absl::StatusOr<bool> s = res_->CheckForgotten(per_container, call_.readmission_possible);
      if (!s.ok()) {
        a_->NoteRefusedHeld();
        return Finish(absl::FailedPreconditionError(s.status().message()));
      }
      readmission_ = *s;
      Begin();
    });
  }

  bool NamesForgotten() const {
    std::shared_ptr<const Resource::Forgotten> held = res_->forgotten();
    if (held->empty()) return false;
    for (const auto& c : call_.request.container_requests()) {
      for (const std::string& id : c.devices_ids()) {
        if (held->count(id) > 0) return true;
      }
    }
    return false;
  }

  bool cancelled() const { return call_.caller != nullptr && call_.caller->IsCancelled(); }

  // Rule 3.
  void WithBackend() {
    a_->WithBackend(call_.caller, call_.timeout, [this](std::shared_ptr<Backend> b) {
      if (b == nullptr) return Finish(cancelled() ? absl::CancelledError() : a_->NoBackend());
      CallBackend(std::move(b));
    });
  }

  // Rule 4: the backend's call and the reservation's sync at once.
  void CallBackend(std::shared_ptr<Backend> b) {
    // Rule 1's other path, before the plugin is asked: its Allocate may
    // reset a device another pod uses. The reservation asks again.
    if (AllocationJournal* j = a_->journal(); j != nullptr) {
      if (absl::Status s = j->CheckOtherPath(res_->name(), call_.request, !call_.claims.empty());
          !s.ok()) {
        a_->NoteRefusedHeld();
        return Finish(s);
      }
    }
    backend_ = std::move(b);
    backend_start_ = absl::Now();
    v1beta1::AllocateRequest to_backend = ToBackendIds(res_, call_.request);
    if (!SameDeviceIds(to_backend, call_.request)) backend_req_ = to_backend;  // for the journal
    const std::shared_ptr<Backend> backend = backend_;
    // From here the flow may end on another thread before this returns:
    // the reservation is set before the last arrival (Arrive).
    backend->AllocateAsync(std::move(to_backend), call_.timeout, call_.caller,
                           [this](absl::StatusOr<v1beta1::AllocateResponse> r) {
                             Answered(std::move(r));
                           });
    reservation_ = Reserve(*backend);
    Arrive();
  }

  AllocationJournal::Reservation Reserve(const Backend& backend) {
    AllocationJournal* journal = a_->journal();
    if (journal == nullptr) {
      reserved_ = absl::OkStatus();
      Arrive();
      return {};
    }
    BackendSide side;
    side.api = std::string(ApiWireVersion(backend.api()));
    side.endpoint = backend.endpoint();
    side.resource = backend.resource();
    side.request = backend_req_ ? &*backend_req_ : nullptr;
    side.claims = call_.claims.empty() ? nullptr : &call_.claims;
    return journal->ReserveAsync(
        res_->name(), call_.request, side,
        [this](absl::Status s) {
          reserved_ = JournalRefusal(s, res_->name());
          Arrive();
        },
        readmission_);
  }

  void Answered(absl::StatusOr<v1beta1::AllocateResponse> r) {
    ObserveBackend("Allocate", r.status());
    if (!r.ok()) return BackendDone(r.status());
    // An answer the kubelet cannot receive fails the pod there: refused
    // here, before anything of it is journalled or held.
    if (const size_t bytes = r->ByteSizeLong(); bytes > kKubeletMaxAnswerBytes) {
      return BackendDone(absl::ResourceExhaustedError(absl::StrCat(
          "the plugin answered Allocate with ", bytes, " bytes, more than the kubelet receives (",
          kKubeletMaxAnswerBytes, " bytes); refused, and none of its devices is held")));
    }
    resp_ = *std::move(r);
    if (call_.pre_start && backend_->options().pre_start_required()) return PreStart(0);
    BackendDone(absl::OkStatus());
  }

  // Rule 5: one container after the other, within the same deadline.
  void PreStart(int container) {
    if (container == call_.request.container_requests_size()) {
      return BackendDone(absl::OkStatus());
    }
    v1beta1::PreStartContainerRequest pre;
    for (const std::string& id : call_.request.container_requests(container).devices_ids()) {
      pre.add_devices_ids(res_->ToBackendId(id));
    }
    backend_start_ = absl::Now();
    backend_->PreStartContainerAsync(
        std::move(pre), std::max(absl::Milliseconds(1), deadline_ - absl::Now()), call_.caller,
        [this, container](absl::Status s) {
          ObserveBackend("PreStartContainer", s);
          if (!s.ok()) return BackendDone(s);
          PreStart(container + 1);
        });
  }

  void BackendDone(absl::Status s) {
    backend_status_ = std::move(s);
    Arrive();
  }

  // The backend's outcome, the reservation's sync and CallBackend's return
  // each arrive once, on any thread; the last one goes on.
  void Arrive() {
    if (arrivals_.fetch_sub(1, std::memory_order_acq_rel) == 1) Joined();
  }

  // Rule 6. A reservation the journal refused holds nothing (the backend
  // may have allocated, as when the kubelet fails a pod after).
  void Joined() {
    if (!reserved_.ok()) return Finish(reserved_);
    if (!backend_status_.ok()) {
      a_->Withdraw(reservation_);
      return Finish(backend_status_);
    }
    if (call_.defer_commit) return Finish(absl::OkStatus());
    a_->Commit(reservation_, resp_, nullptr, [this](absl::Status s) {
      if (!s.ok()) a_->Withdraw(reservation_);
      Finish(s);
    });
  }

  void ObserveBackend(const char* method, const absl::Status& s) {
    a_->ObserveBackendCall(method, call_.kubelet_api, *backend_, s, backend_start_);
  }

  void Finish(const absl::Status& s) {
    if (s.ok()) {
      Allocator::Allocated out;
      out.response = std::move(resp_);
      out.backend = backend_;
      if (call_.defer_commit) out.reservation = reservation_;
      done_(std::move(out));
    } else {
      done_(s);
    }
    delete this;
  }

  Allocator* const a_;
  Resource* const res_;
  const Call call_;
  const Done done_;
  const absl::Time deadline_;
  bool forgotten_checked_ = false;
  // A running container's re-admission that names devices other forgotten
  // containers hold: journaled beside their records (CheckForgotten).
  bool readmission_ = false;
  std::shared_ptr<Backend> backend_;
  // The request as the backend got it, where its IDs differ (an ID map).
  std::optional<v1beta1::AllocateRequest> backend_req_;
  absl::Time backend_start_;
  v1beta1::AllocateResponse resp_;
  // Joined() runs when all three have arrived (Arrive).
  std::atomic<int> arrivals_{3};
  absl::Status backend_status_;
  absl::Status reserved_;
  AllocationJournal::Reservation reservation_;
};

Allocator::Allocator(Resource* resource, AllocationJournal* journal, Telemetry* telemetry)
    : resource_(resource), journal_(journal), telemetry_(telemetry) {}

void Allocator::Allocate(Call call, Done done) {
  (new Flow(this, std::move(call), std::move(done)))->Begin();
}

void Allocator::WithBackend(const grpc::ServerContextBase* caller, absl::Duration timeout,
                            std::function<void(std::shared_ptr<Backend>)> then) {
  if (std::shared_ptr<Backend> b = resource_->backend(); b != nullptr) return then(std::move(b));
  jobs_.Spawn([this, caller, timeout, then = std::move(then)] {
    const absl::Time until = absl::Now() + std::min(kBackendWait, timeout);
    std::shared_ptr<Backend> b;
    while (b == nullptr && !(caller != nullptr && caller->IsCancelled()) && absl::Now() < until) {
      b = resource_->WaitForBackend(std::min(absl::Milliseconds(100), until - absl::Now()));
    }
    then(std::move(b));  // the caller's call is not finished before this: it lives
  });
}

Allocator::~Allocator() { jobs_.JoinAll(); }

void Allocator::ObserveBackendCall(const char* method, absl::string_view kubelet_api,
                                   const Backend& b, const absl::Status& s,
                                   absl::Time start) const {
  if (telemetry_ == nullptr) return;
  telemetry_->ObserveRpc("backend", method, resource_->name(), kubelet_api,
                         ApiWireVersion(b.api()),
                         GrpcCodeName(static_cast<grpc::StatusCode>(s.code())),
                         absl::Now() - start);
}

absl::Status Allocator::NoBackend() const {
  return absl::UnavailableError(absl::StrCat(
      "no backend is connected for resource ", resource_->name(), "; ",
      resource_->ShownWhileAway()));
}

void Allocator::Commit(const AllocationJournal::Reservation& r,
                       const v1beta1::AllocateResponse& response,
                       const std::vector<state::DraClaim>* claims,
                       std::function<void(absl::Status)> done) {
  if (journal_ == nullptr) return done(absl::OkStatus());
  journal_->AnswerAsync(r, response,
                        [done = std::move(done), name = resource_->name()](absl::Status s) {
                          done(JournalRefusal(s, name));
                        },
                        claims);
}

void Allocator::Withdraw(const AllocationJournal::Reservation& r) {
  if (journal_ != nullptr) journal_->Withdraw(r);
}

}  // namespace dpproxy
