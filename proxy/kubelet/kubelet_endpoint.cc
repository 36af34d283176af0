#include "proxy/kubelet/kubelet_endpoint.h"

#include <errno.h>
#include <unistd.h>

#include <thread>
#include <unordered_set>

#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>
#include <glog/logging.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "proto/pluginregistration/api.grpc.pb.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/kubelet/client_name_release.h"
#include "proxy/util/files.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/rpc/newest_writer.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/util/status_macros.h"

namespace dpproxy {
namespace {

std::string SocketNameFor(const std::string& resource, int generation) {
  std::string n = resource;
  for (char& c : n) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  }
  return generation == 0 ? absl::StrCat("dpproxy-", n, ".sock")
                         : absl::StrCat("dpproxy-", n, ".", generation, ".sock");
}

// "cdi.k8s.io/dpproxy_vendor.com_gpu": the CDI annotation convention's
// prefix, and a name part that is a valid annotation name.
std::string CdiAnnotationKey(const std::string& resource) {
  std::string n = resource;
  for (char& c : n) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  }
  std::string name = absl::StrCat("dpproxy_", n);
  if (name.size() > 63) name.resize(63);
  while (!name.empty() && !absl::ascii_isalnum(static_cast<unsigned char>(name.back()))) {
    name.pop_back();
  }
  return absl::StrCat("cdi.k8s.io/", name);
}

// Checks a kubelet's request names only devices this resource has.
grpc::Status CheckRequest(Resource* r, const v1beta1::AllocateRequest& req) {
  if (req.container_requests_size() == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "AllocateRequest has no container requests");
  }
  for (int i = 0; i < req.container_requests_size(); ++i) {
    const auto& c = req.container_requests(i);
    if (c.devices_ids_size() == 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("container request ", i + 1, " names no device"));
    }
    std::unordered_set<std::string> seen;
    for (const std::string& id : c.devices_ids()) {
      std::optional<std::string> health = r->DeviceHealth(id);
      if (!health.has_value()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("unknown device ID ", GoQuote(id), " for resource ",
                                         r->name()));
      }
      if (!seen.insert(id).second) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("container request ", i + 1, " names device ",
                                         GoQuote(id), " twice"));
      }
      if (*health != kHealthy) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("device ", GoQuote(id), " of resource ", r->name(),
                                         " is ", *health, "; dpproxy does not allocate it"));
      }
    }
  }
  return grpc::Status::OK;
}

// The request with the kubelet's device IDs renamed to the backend's.
bool SameDeviceIds(const v1beta1::AllocateRequest& a, const v1beta1::AllocateRequest& b) {
  if (a.container_requests_size() != b.container_requests_size()) return false;
  for (int i = 0; i < a.container_requests_size(); ++i) {
    const auto& x = a.container_requests(i).devices_ids();
    const auto& y = b.container_requests(i).devices_ids();
    if (!std::equal(x.begin(), x.end(), y.begin(), y.end())) return false;
  }
  return true;
}

v1beta1::AllocateRequest ToBackendIds(Resource* r, const v1beta1::AllocateRequest& req) {
  v1beta1::AllocateRequest out = req;
  for (auto& c : *out.mutable_container_requests()) {
    for (auto& id : *c.mutable_devices_ids()) id = r->ToBackendId(id);
  }
  return out;
}

// How long a call that finds no backend waits for one (at most the
// backend timeout): after dpproxy and its plugin restart together, the
// kubelet may be shown the remembered devices before the plugin has
// registered again, and a pod admitted then must not fail for it.
constexpr absl::Duration kBackendWait = absl::Seconds(10);

// Runs `then` with the resource's backend: at once if one is connected;
// otherwise from a thread of its own that waits for one (at most
// kBackendWait, within the backend timeout) in short steps, so that a
// kubelet that gives up ends the wait. Null if none came.
void WithBackend(KubeletEndpoint* e, grpc::CallbackServerContext* ctx,
                 std::function<void(std::shared_ptr<Backend>)> then) {
  std::shared_ptr<Backend> b = e->resource()->backend();
  if (b != nullptr) return then(std::move(b));
  std::thread([e, ctx, then = std::move(then)] {
    const absl::Time until = absl::Now() + std::min(kBackendWait, e->backend_timeout());
    std::shared_ptr<Backend> b;
    while (b == nullptr && !ctx->IsCancelled() && absl::Now() < until) {
      b = e->resource()->WaitForBackend(std::min(absl::Milliseconds(100), until - absl::Now()));
    }
    then(std::move(b));  // the call is not finished before this: ctx lives
  }).detach();
}

grpc::Status NoBackend(Resource* r) {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat("no backend is connected for resource ", r->name(),
                                   "; its devices are reported Unhealthy until one registers"));
}

}  // namespace

// --- ListAndWatch streams ------------------------------------------------------------

namespace {

// A buffer that gRPC writes straight from `wire`, which it keeps alive until
// the write is done: no copy.
std::shared_ptr<const grpc::ByteBuffer> WireBuffer(std::shared_ptr<const std::string> wire) {
  if (wire->empty()) {
    grpc::Slice empty;  // a valid buffer of no bytes: the empty message
    return std::make_shared<const grpc::ByteBuffer>(&empty, 1);
  }
  auto* keep = new std::shared_ptr<const std::string>(std::move(wire));
  grpc::Slice slice(const_cast<char*>((*keep)->data()), (*keep)->size(),
                    [](void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); },
                    keep);
  return std::make_shared<const grpc::ByteBuffer>(&slice, 1);
}

}  // namespace

// One ListAndWatch stream toward the kubelet, served without a thread of
// its own (NewestWriter): the current list at once, then the newest list
// whenever the resource publishes one, translated only when its write
// starts (the kubelet only ever needs the latest list). Ends when the
// kubelet goes away, the server is replaced or the proxy stops
// (KubeletEndpoint::FinishStreams), and deletes itself when gRPC is done.
template <typename Msg>
class ListAndWatchStream final : public NewestWriter<Msg>, public KubeletEndpoint::StreamHandle {
 public:
  // Makes the message for a published list (the version the kubelet
  // speaks).
  using Translate = std::function<std::shared_ptr<const Msg>(const Resource::Snapshot&)>;

  ListAndWatchStream(KubeletEndpoint* e, Translate translate)
      : e_(e), translate_(std::move(translate)) {
    e_->AddStream(this);
    watcher_ = e_->resource()->AddWatcher([this](const Resource::Snapshot& s) { Publish(s); });
    Publish(e_->resource()->Current());
  }

  void FinishNow() override { NewestWriter<Msg>::FinishNow(); }

 private:
  void Publish(const Resource::Snapshot& s) {
    NewestWriter<Msg>::Publish(s.version, [t = translate_, s] { return t(s); });
  }
  void OnFinished() override {
    e_->resource()->RemoveWatcher(watcher_);  // no Publish runs after this
    e_->RemoveStream(this, this->ended_by_client());
  }

  KubeletEndpoint* const e_;
  const Translate translate_;
  uint64_t watcher_ = 0;
};

// --- Timing -------------------------------------------------------------------------

// Times one kubelet-side call from its start to Done(), which passes the
// answer's status through.
class KubeletCall {
 public:
  KubeletCall(KubeletEndpoint* e, const char* method, ApiVersion kubelet_api)
      : e_(e), method_(method), kubelet_api_(kubelet_api), start_(absl::Now()) {}
  // The backend that served it, for the backend_api label.
  void set_backend(const Backend* b) { backend_api_ = b->api(); }
  grpc::Status Done(grpc::Status s) {
    if (e_->telemetry() != nullptr) {
      e_->telemetry()->ObserveRpc(
          "kubelet", method_, e_->resource()->name(), ApiWireVersion(kubelet_api_),
          backend_api_.has_value() ? ApiWireVersion(*backend_api_) : absl::string_view(),
          GrpcCodeName(s.error_code()), absl::Now() - start_);
    }
    return s;
  }

 private:
  KubeletEndpoint* const e_;
  const char* const method_;
  const ApiVersion kubelet_api_;
  const absl::Time start_;
  std::optional<ApiVersion> backend_api_;
};

// Times one call to the backend (side=backend), started at `start`.
void ObserveBackendCall(KubeletEndpoint* e, const char* method, ApiVersion kubelet_api,
                        const Backend& b, const absl::Status& s, absl::Time start) {
  if (e->telemetry() == nullptr) return;
  e->telemetry()->ObserveRpc("backend", method, e->resource()->name(),
                             ApiWireVersion(kubelet_api), ApiWireVersion(b.api()),
                             GrpcCodeName(static_cast<grpc::StatusCode>(s.code())),
                             absl::Now() - start);
}

// --- Allocate -----------------------------------------------------------------------

// The one Allocate policy, whatever API the kubelet speaks (its edge
// translates the request in and the response out): check the request as
// the kubelet's rules allow, map the IDs to the backend's, call it with a
// deadline (cancelled with the kubelet's call), call PreStartContainer for
// a kubelet that never will (v1alpha) when the backend needs it, journal the
// answer durably, and only then answer.
//
// Served with gRPC's callback API: no thread waits on the call. Each step
// starts the next from the callback that ends it (the backend's answer on
// one of gRPC's threads, the journal's on its group-commit writer), and the
// reactor deletes itself once gRPC is done with it. Only a call that finds
// no backend yet (dpproxy and its plugin restarting together) waits, on a
// thread of its own, for one to register.
class AllocateReactor final : public grpc::ServerUnaryReactor {
 public:
  // Writes the core's answer into the kubelet's response message.
  using Answer = std::function<void(v1beta1::AllocateResponse)>;

  // Starts serving `req`; the reactor is gRPC's from then on.
  static grpc::ServerUnaryReactor* Start(KubeletEndpoint* e, grpc::CallbackServerContext* ctx,
                                         ApiVersion kubelet_api, v1beta1::AllocateRequest req,
                                         Answer answer) {
    auto* r = new AllocateReactor(e, ctx, kubelet_api, std::move(req), std::move(answer));
    r->Begin();
    return r;
  }

  // The backend's call ends with the kubelet's through gRPC's propagation;
  // a wait for a backend ends here, and a held call ends at once.
  void OnCancel() override {
    cancelled_ = true;
    if (e_->Unhold(this)) End(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }
  // Both reactions are short and never block (a flag, a map lookup under
  // the endpoint's lock, a Finish), so gRPC may run them on the thread that
  // ends the call. Otherwise it hands every call's end to its executor
  // thread: a thread hop per Allocate, about 10 us of CPU per call on a
  // 2-core machine (tools/dev bench, "CPU time per call"). gRPC's own reactor for
  // CallbackServerContext::DefaultReactor() says the same of itself; the
  // hook is public but marked internal in gRPC 1.51's headers, so a gRPC
  // that drops it fails this build rather than changing behaviour.
  bool InternalInlineable() override { return true; }

 private:
  AllocateReactor(KubeletEndpoint* e, grpc::CallbackServerContext* ctx, ApiVersion kubelet_api,
                  v1beta1::AllocateRequest req, Answer answer)
      : e_(e),
        ctx_(ctx),
        kubelet_api_(kubelet_api),
        req_(std::move(req)),
        answer_(std::move(answer)),
        call_(e, "Allocate", kubelet_api),
        timeout_(e->backend_timeout()),
        deadline_(absl::Now() + timeout_) {}

  void Begin() {
    Resource* res = e_->resource();
    if (grpc::Status s = CheckRequest(res, req_); !s.ok()) return End(s);
    // A device held by a container the kubelet forgot: asked once, on a
    // thread of its own (it may ask the kubelet's pod-resources API),
    // whether its holder is gone; refused with the holder named if not.
    if (!forgotten_checked_) {
      if (NamesForgotten(res)) {
        forgotten_checked_ = true;
        std::vector<std::vector<std::string>> per_container;
        for (const auto& c : req_.container_requests()) {
          per_container.emplace_back(c.devices_ids().begin(), c.devices_ids().end());
        }
        std::thread([this, res, per_container = std::move(per_container)] {
          absl::StatusOr<bool> s =
              res->CheckForgotten(per_container, e_->kubelet_may_reallocate_running());
          if (!s.ok()) {
            e_->NoteRefusal();
            return End(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                    std::string(s.status().message())));
          }
          readmission_ = *s;
          Begin();
        }).detach();
        return;
      }
    }
    // A handoff may hold the call, or send it on to the new dpproxy.
    std::shared_ptr<v1beta1::DevicePlugin::Stub> forward_to;
    switch (e_->AdmitAllocate(this, [this] { Begin(); }, &forward_to)) {
      case KubeletEndpoint::AllocateMode::kHold:
        return;  // Begin() runs again when the handoff moves on
      case KubeletEndpoint::AllocateMode::kForward:
        counted_ = true;
        return Forward(std::move(forward_to));
      case KubeletEndpoint::AllocateMode::kServe:
        counted_ = true;
        break;
    }
    // With no backend yet it waits for one (dpproxy and its plugin
    // restarting together), and a kubelet that gives up ends the wait.
    WithBackend(e_, ctx_, [this](std::shared_ptr<Backend> b) {
      if (b == nullptr) {
        return End(cancelled_ ? grpc::Status::CANCELLED : NoBackend(e_->resource()));
      }
      CallBackend(std::move(b));  // the last touch of this reactor here
    });
  }

  void CallBackend(std::shared_ptr<Backend> b) {
    backend_ = std::move(b);
    call_.set_backend(backend_.get());
    backend_start_ = absl::Now();
    // The last step here: the answer may arrive, and the reactor end, on
    // another thread before this call returns.
    v1beta1::AllocateRequest to_backend = ToBackendIds(e_->resource(), req_);
    if (!SameDeviceIds(to_backend, req_)) backend_req_ = to_backend;  // for the journal
    const std::shared_ptr<Backend> backend = backend_;
    backend_->AllocateAsync(std::move(to_backend), timeout_, ctx_,
                            [this](absl::StatusOr<v1beta1::AllocateResponse> r) {
                              Allocated(std::move(r));
                            });
    // The reservation's write and fdatasync run on this thread while the
    // backend answers; the kubelet's answer waits for both (Joined).
    reservation_ = e_->Reserve(
        req_, backend_req_ ? &*backend_req_ : nullptr, *backend,
        [this](grpc::Status s) {
          reserved_ = std::move(s);
          Arrive();
        },
        readmission_);
    Arrive();  // reservation_ is set; the last touch of this reactor here
  }

  void Allocated(absl::StatusOr<v1beta1::AllocateResponse> r) {
    ObserveBackend("Allocate", r.status());
    if (!r.ok()) return BackendDone(ToGrpcStatus(r.status()));
    resp_ = *std::move(r);
    if (kubelet_api_ == ApiVersion::kV1Alpha && backend_->options().pre_start_required()) {
      // A 1.9 kubelet never calls PreStartContainer: the proxy does, right
      // after Allocate, within the same deadline.
      v1beta1::PreStartContainerRequest pre;
      for (const auto& c : req_.container_requests()) {
        for (const std::string& id : c.devices_ids()) {
          pre.add_devices_ids(e_->resource()->ToBackendId(id));
        }
      }
      backend_start_ = absl::Now();
      backend_->PreStartContainerAsync(
          std::move(pre), std::max(absl::Milliseconds(1), deadline_ - absl::Now()), ctx_,
          [this](absl::Status s) {
            ObserveBackend("PreStartContainer", s);
            BackendDone(ToGrpcStatus(s));
          });
      return;
    }
    BackendDone(grpc::Status::OK);
  }

  void BackendDone(grpc::Status s) {
    backend_status_ = std::move(s);
    Arrive();
  }

  // The backend's outcome, the reservation's sync and Reserve's return
  // (its ids) each arrive once, on any thread; the last one goes on.
  void Arrive() {
    if (arrivals_.fetch_sub(1, std::memory_order_acq_rel) == 1) Joined();
  }

  void Joined() {
    // Refused by the journal: nothing holds the devices (the backend may
    // have allocated them, as when the kubelet fails the pod after).
    if (!reserved_.ok()) return End(reserved_);
    if (!backend_status_.ok()) {
      e_->Withdraw(reservation_);
      return End(backend_status_);
    }
    e_->Answer(reservation_, resp_, [this](grpc::Status s) {
      if (!s.ok()) {
        e_->Withdraw(reservation_);
        return End(s);
      }
      Answered();
    });
  }

  void Answered() {
    Resource* res = e_->resource();
    // v1alpha has no annotations: adding them would only count a loss.
    if (e_->cdi_annotations() && kubelet_api_ == ApiVersion::kV1Beta1) {
      for (auto& c : *resp_.mutable_container_responses()) {
        if (c.cdi_devices_size() == 0) continue;
        std::vector<std::string> names;
        for (const auto& d : c.cdi_devices()) names.push_back(d.name());
        (*c.mutable_annotations())[CdiAnnotationKey(res->name())] = absl::StrJoin(names, ",");
      }
    }
    e_->events()->Emit("allocate",
                       {{"resource", res->name()},
                        {"kubelet_api", std::string(ApiWireVersion(kubelet_api_))},
                        {"containers", req_.container_requests_size()}});
    answer_(std::move(resp_));
    End(grpc::Status::OK);
  }

  // During a handoff: the new dpproxy serves the call (its checks, its
  // backend, its journal) and its answer is the kubelet's.
  void Forward(std::shared_ptr<v1beta1::DevicePlugin::Stub> stub) {
    forward_stub_ = std::move(stub);
    forward_ctx_ = grpc::ClientContext::FromServerContext(*ctx_);
    forward_ctx_->set_deadline(absl::ToChronoTime(deadline_));
    forward_ctx_->set_wait_for_ready(true);  // a reconnect rides on, within the deadline
    forward_stub_->async()->Allocate(forward_ctx_.get(), &req_, &resp_, [this](grpc::Status s) {
      if (!s.ok()) {
        return End(grpc::Status(
            s.error_code(), absl::StrCat("dpproxy is handing over to a new dpproxy, which "
                                         "refused the Allocate: ", s.error_message())));
      }
      answer_(std::move(resp_));
      End(grpc::Status::OK);
    });
  }

  // Times one backend call (side=backend).
  void ObserveBackend(const char* method, const absl::Status& s) {
    if (e_->telemetry() == nullptr) return;
    e_->telemetry()->ObserveRpc("backend", method, e_->resource()->name(),
                                ApiWireVersion(kubelet_api_), ApiWireVersion(backend_->api()),
                                GrpcCodeName(static_cast<grpc::StatusCode>(s.code())),
                                absl::Now() - backend_start_);
  }

  void End(const grpc::Status& s) {
    if (counted_) e_->AllocateServed();
    Finish(call_.Done(s));
  }

  // Whether the request names a device containers the kubelet forgot hold.
  bool NamesForgotten(Resource* res) const {
    std::shared_ptr<const Resource::Forgotten> held = res->forgotten();
    if (held->empty()) return false;
    for (const auto& c : req_.container_requests()) {
      for (const std::string& id : c.devices_ids()) {
        if (held->count(id) > 0) return true;
      }
    }
    return false;
  }

  KubeletEndpoint* const e_;
  grpc::CallbackServerContext* const ctx_;
  const ApiVersion kubelet_api_;
  const v1beta1::AllocateRequest req_;
  bool forgotten_checked_ = false;
  // A running container's re-admission that names devices other forgotten
  // containers hold: journaled beside their records (CheckForgotten).
  bool readmission_ = false;
  const Answer answer_;
  KubeletCall call_;
  const absl::Duration timeout_;
  const absl::Time deadline_;
  std::atomic<bool> cancelled_{false};
  bool counted_ = false;  // admitted by the endpoint's gate, served or forwarded
  std::shared_ptr<v1beta1::DevicePlugin::Stub> forward_stub_;
  std::unique_ptr<grpc::ClientContext> forward_ctx_;
  std::shared_ptr<Backend> backend_;
  // The request as the backend got it, where its IDs differ (an ID map).
  std::optional<v1beta1::AllocateRequest> backend_req_;
  absl::Time backend_start_;
  v1beta1::AllocateResponse resp_;
  // Joined() runs when all three have arrived (Arrive).
  std::atomic<int> arrivals_{3};
  grpc::Status backend_status_;
  grpc::Status reserved_;
  AllocationJournal::Reservation reservation_;
};

// --- GetPreferredAllocation -------------------------------------------------------

// Answers a GetPreferredAllocation from `picks` (the backend's, per
// container; empty if it has none) steering around `held` (preferred.h).
// If the answer must name held devices, their holders are checked first,
// once, on a thread of its own (it asks pod-resources): one gone since
// (its pod deleted a moment ago) frees its devices for this answer.
void FinishPreferred(KubeletEndpoint* e, const v1beta1::PreferredAllocationRequest* req,
                     v1beta1::PreferredAllocationResponse* resp,
                     grpc::ServerUnaryReactor* reactor, std::shared_ptr<KubeletCall> call,
                     std::vector<std::vector<std::string>> picks,
                     std::shared_ptr<const Resource::Forgotten> held, bool refreshed) {
  std::vector<PreferredChoice> choices;
  std::vector<std::string> named;
  for (int i = 0; i < req->container_requests_size(); ++i) {
    choices.push_back(ChoosePreferred(req->container_requests(i), picks[i], *held));
    for (const std::string& id : choices.back().ids) {
      if (held->count(id) > 0) named.push_back(id);
    }
  }
  if (!named.empty() && !refreshed) {
    std::thread([e, req, resp, reactor, call = std::move(call), picks = std::move(picks),
                 held = std::move(held), named = std::move(named)]() mutable {
      const std::set<std::string> still = e->resource()->StillForgotten(named);
      auto fresh = std::make_shared<Resource::Forgotten>(*held);
      for (const std::string& id : named) {
        if (still.count(id) == 0) fresh->erase(id);
      }
      FinishPreferred(e, req, resp, reactor, std::move(call), std::move(picks),
                      std::move(fresh), /*refreshed=*/true);
    }).detach();
    return;  // the call is not finished before the thread answers: req, resp live
  }
  for (PreferredChoice& choice : choices) {
    e->NoteSteering(choice);
    auto* out = resp->add_container_responses();
    for (std::string& id : choice.ids) out->add_deviceids(std::move(id));
  }
  reactor->Finish(call->Done(grpc::Status::OK));
}

// --- Services ---------------------------------------------------------------------

class KubeletEndpoint::Services {
 public:
  // Every call that may wait (for the plugin, for the journal) is served
  // with gRPC's callback API. GetDevicePluginOptions, which answers from
  // memory at once, stays synchronous: with it on the callback API, bench
  // runs with a 100 ms re-registration were more frequent (5 of 14, against
  // 1 of 14). Their cause turned out to be Register's own channel to
  // kubelet.sock (see Register), and a callback-only server has not been
  // measured again since that was fixed.
  class Beta final : public v1beta1::DevicePlugin::WithRawCallbackMethod_ListAndWatch<
                         v1beta1::DevicePlugin::WithCallbackMethod_GetPreferredAllocation<
                             v1beta1::DevicePlugin::WithCallbackMethod_Allocate<
                                 v1beta1::DevicePlugin::WithCallbackMethod_PreStartContainer<
                                     v1beta1::DevicePlugin::Service>>>> {
   public:
    explicit Beta(KubeletEndpoint* e) : e_(e) {}

    grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                        v1beta1::DevicePluginOptions* resp) override {
      KubeletCall call(e_, "GetDevicePluginOptions", ApiVersion::kV1Beta1);
      e_->NoteOptionsAsked();
      *resp = e_->resource()->options();
      return call.Done(grpc::Status::OK);
    }

    // Raw: the published list is held as the v1beta1 message's bytes, which
    // every stream writes as they are (never serialized again, never copied).
    grpc::ServerWriteReactor<grpc::ByteBuffer>* ListAndWatch(grpc::CallbackServerContext*,
                                                             const grpc::ByteBuffer*) override {
      return new ListAndWatchStream<grpc::ByteBuffer>(
          e_, [](const Resource::Snapshot& s) { return WireBuffer(s.list->shared_wire()); });
    }

    // The kubelet's IDs to the backend's and back; the backend is called
    // through its callback call. dpproxy offers the method for every
    // backend: for one without it, it answers from the available devices;
    // and while containers the kubelet forgot hold devices, every answer
    // steers away from those (proxy/core/preferred.h).
    grpc::ServerUnaryReactor* GetPreferredAllocation(
        grpc::CallbackServerContext* ctx, const v1beta1::PreferredAllocationRequest* req,
        v1beta1::PreferredAllocationResponse* resp) override {
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      auto call =
          std::make_shared<KubeletCall>(e_, "GetPreferredAllocation", ApiVersion::kV1Beta1);
      KubeletEndpoint* e = e_;
      Resource* res = e->resource();
      std::shared_ptr<const Resource::Forgotten> held = res->forgotten();
      if (!held->empty() && e->kubelet_may_reallocate_running()) {
        // A kubelet before 1.25 re-admitting a running container it forgot
        // allocates again: its own devices are the ones to name.
        bool all = true;
        v1beta1::PreferredAllocationResponse own;
        for (const auto& c : req->container_requests()) {
          std::set<std::string> available(c.available_deviceids().begin(),
                                          c.available_deviceids().end());
          std::vector<std::string> pick = res->ReadmissionPick(c.allocation_size(), available);
          if (pick.empty()) {
            all = false;
            break;
          }
          auto* out = own.add_container_responses();
          for (std::string& id : pick) out->add_deviceids(std::move(id));
        }
        if (all && req->container_requests_size() > 0) {
          *resp = std::move(own);
          reactor->Finish(call->Done(grpc::Status::OK));
          return reactor;
        }
      }
      if (!res->backend_offers_preferred()) {
        FinishPreferred(e, req, resp, reactor, call,
                        std::vector<std::vector<std::string>>(req->container_requests_size()),
                        std::move(held), /*refreshed=*/false);
        return reactor;
      }
      WithBackend(e, ctx, [e, ctx, req, resp, reactor, call,
                           held = std::move(held)](std::shared_ptr<Backend> b) {
        if (b == nullptr) return reactor->Finish(call->Done(NoBackend(e->resource())));
        call->set_backend(b.get());
        Resource* res = e->resource();
        v1beta1::PreferredAllocationRequest breq = *req;
        for (auto& c : *breq.mutable_container_requests()) {
          if (!held->empty()) {
            // Offer the backend only devices nobody holds, where enough are.
            std::set<std::string> must(c.must_include_deviceids().begin(),
                                       c.must_include_deviceids().end());
            std::vector<std::string> free;
            for (const std::string& id : c.available_deviceids()) {
              if (held->count(id) == 0 || must.count(id) > 0) free.push_back(id);
            }
            if (static_cast<int>(free.size()) >= c.allocation_size() &&
                free.size() < static_cast<size_t>(c.available_deviceids_size())) {
              c.clear_available_deviceids();
              for (std::string& id : free) c.add_available_deviceids(std::move(id));
            }
          }
          for (auto& id : *c.mutable_available_deviceids()) id = res->ToBackendId(id);
          for (auto& id : *c.mutable_must_include_deviceids()) id = res->ToBackendId(id);
        }
        const absl::Time start = absl::Now();
        Backend* backend = b.get();
        backend->GetPreferredAllocationAsync(
            std::move(breq), e->backend_timeout(), ctx,
            [e, req, resp, reactor, call, b = std::move(b), held,
             start](absl::StatusOr<v1beta1::PreferredAllocationResponse> r) {
              ObserveBackendCall(e, "GetPreferredAllocation", ApiVersion::kV1Beta1, *b,
                                 r.status(), start);
              if (!r.ok()) return reactor->Finish(call->Done(ToGrpcStatus(r.status())));
              *resp = *std::move(r);
              for (auto& c : *resp->mutable_container_responses()) {
                for (auto& id : *c.mutable_deviceids()) id = e->resource()->ToKubeletId(id);
              }
              if (held->empty()) return reactor->Finish(call->Done(grpc::Status::OK));
              // Exactly the size asked, held devices last: the kubelet
              // would top a short answer up from any of them.
              std::vector<std::vector<std::string>> picks(req->container_requests_size());
              for (int i = 0; i < req->container_requests_size() &&
                              i < resp->container_responses_size();
                   ++i) {
                picks[i].assign(resp->container_responses(i).deviceids().begin(),
                                resp->container_responses(i).deviceids().end());
              }
              resp->Clear();
              FinishPreferred(e, req, resp, reactor, call, std::move(picks), held,
                              /*refreshed=*/false);
            });
      });
      return reactor;
    }

    grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* ctx,
                                       const v1beta1::AllocateRequest* req,
                                       v1beta1::AllocateResponse* resp) override {
      return AllocateReactor::Start(e_, ctx, ApiVersion::kV1Beta1, *req,
                                    [resp](v1beta1::AllocateResponse r) { *resp = std::move(r); });
    }

    grpc::ServerUnaryReactor* PreStartContainer(grpc::CallbackServerContext* ctx,
                                                const v1beta1::PreStartContainerRequest* req,
                                                v1beta1::PreStartContainerResponse*) override {
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      auto call = std::make_shared<KubeletCall>(e_, "PreStartContainer", ApiVersion::kV1Beta1);
      KubeletEndpoint* e = e_;
      WithBackend(e, ctx, [e, ctx, req, reactor, call](std::shared_ptr<Backend> b) {
        if (b == nullptr) return reactor->Finish(call->Done(NoBackend(e->resource())));
        call->set_backend(b.get());
        v1beta1::PreStartContainerRequest breq = *req;
        for (auto& id : *breq.mutable_devices_ids()) id = e->resource()->ToBackendId(id);
        const absl::Time start = absl::Now();
        Backend* backend = b.get();
        backend->PreStartContainerAsync(
            std::move(breq), e->backend_timeout(), ctx,
            [e, reactor, call, b = std::move(b), start](absl::Status s) {
              ObserveBackendCall(e, "PreStartContainer", ApiVersion::kV1Beta1, *b, s, start);
              reactor->Finish(call->Done(ToGrpcStatus(s)));
            });
      });
      return reactor;
    }

   private:
    KubeletEndpoint* const e_;
  };

  class Alpha final : public deviceplugin::DevicePlugin::WithCallbackMethod_ListAndWatch<
                          deviceplugin::DevicePlugin::WithCallbackMethod_Allocate<
                              deviceplugin::DevicePlugin::Service>> {
   public:
    explicit Alpha(KubeletEndpoint* e) : e_(e) {}

    grpc::ServerWriteReactor<deviceplugin::ListAndWatchResponse>* ListAndWatch(
        grpc::CallbackServerContext*, const deviceplugin::Empty*) override {
      KubeletEndpoint* e = e_;
      return new ListAndWatchStream<deviceplugin::ListAndWatchResponse>(
          e, [e](const Resource::Snapshot& s) {
            Loss loss;
            auto out = std::make_shared<const deviceplugin::ListAndWatchResponse>(
                ToV1AlphaList(s.list->ToMessage(), &loss));
            e->NoteLoss(loss);
            return out;
          });
    }

    // The edge only translates: v1alpha in, the one core, v1alpha out.
    grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* ctx,
                                       const deviceplugin::AllocateRequest* req,
                                       deviceplugin::AllocateResponse* resp) override {
      KubeletEndpoint* e = e_;
      return AllocateReactor::Start(e, ctx, ApiVersion::kV1Alpha, FromV1AlphaAllocate(*req),
                                    [e, resp](v1beta1::AllocateResponse r) {
                                      Loss loss;
                                      *resp = ToV1AlphaResponse(r.container_responses(0), &loss);
                                      e->NoteLoss(loss);
                                    });
    }

   private:
    KubeletEndpoint* const e_;
  };

  class Watcher final : public pluginregistration::Registration::WithCallbackMethod_GetInfo<
                            pluginregistration::Registration::WithCallbackMethod_NotifyRegistrationStatus<
                                pluginregistration::Registration::Service>> {
   public:
    explicit Watcher(KubeletEndpoint* e) : e_(e) {}
    grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* ctx,
                                      const pluginregistration::InfoRequest*,
                                      pluginregistration::PluginInfo* info) override {
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      reactor->Finish(Info(info));
      return reactor;
    }
    grpc::ServerUnaryReactor* NotifyRegistrationStatus(
        grpc::CallbackServerContext* ctx, const pluginregistration::RegistrationStatus* st,
        pluginregistration::RegistrationStatusResponse*) override {
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      reactor->Finish(Notified(*st));
      return reactor;
    }

   private:
    grpc::Status Info(pluginregistration::PluginInfo* info) {
      info->set_type(std::string(kDevicePluginType));
      info->set_name(e_->resource()->name());
      info->set_endpoint(e_->socket_path());
      // Every version served on this socket; the kubelet picks v1beta1.
      info->add_supported_versions(std::string(kV1Beta1Version));
      info->add_supported_versions(std::string(kV1AlphaVersion));
      return grpc::Status::OK;
    }
    grpc::Status Notified(const pluginregistration::RegistrationStatus& st) {
      if (st.plugin_registered()) {
        e_->SetNegotiated("v1beta1 (plugin-watcher)");
      } else {
        LOG(ERROR) << "resource " << e_->resource()->name()
                   << ": the kubelet's plugin watcher refused registration: " << st.error();
        e_->events()->Emit("kubelet_registration_failed",
                           {{"resource", e_->resource()->name()},
                            {"via", "plugin-watcher"},
                            {"error", st.error()}});
      }
      return grpc::Status::OK;
    }

    KubeletEndpoint* const e_;
  };

  explicit Services(KubeletEndpoint* e) : beta(e), alpha(e), watcher(e) {}
  Beta beta;
  Alpha alpha;
  Watcher watcher;
  // A callback generic service serves one server in its life: one per Serve().
  std::unique_ptr<GoStyleUnknownHandler> unknown;
};

// --- KubeletEndpoint -------------------------------------------------------------------

KubeletEndpoint::KubeletEndpoint(Resource* resource, const KubeletSideOptions& options,
                                 LossCounter* losses, EventLog* events,
                                 AllocationJournal* journal, Telemetry* telemetry)
    : resource_(resource),
      options_(options),
      backend_timeout_ns_(absl::ToInt64Nanoseconds(options.backend_timeout)),
      cdi_annotations_(options.cdi_annotations),
      losses_(losses),
      events_(events),
      journal_(journal),
      telemetry_(telemetry),
      socket_name_(SocketNameFor(resource->name(), options.socket_generation)),
      socket_path_(options.registration == KubeletRegistration::kPluginWatcher
                       ? JoinPath(JoinPath(options.kubelet_root, "plugins_registry"), socket_name_)
                       : JoinPath(DevicePluginDir(options), socket_name_)),
      services_(std::make_unique<Services>(this)) {}

KubeletEndpoint::~KubeletEndpoint() { Stop(); }

void KubeletEndpoint::NoteSteering(const PreferredChoice& choice) {
  if (choice.avoided > 0) avoided_ += choice.avoided;
  if (choice.held_named > 0) {
    held_named_ += choice.held_named;
    LOG(WARNING) << "resource " << resource_->name() << ": a GetPreferredAllocation had to name "
                 << choice.held_named
                 << " device(s) held by containers the kubelet forgot (too few others are "
                    "available); an Allocate naming them is refused while their holders run";
  }
}

void KubeletEndpoint::NoteRefusal() { ++refused_; }

void KubeletEndpoint::NoteOptionsAsked() {
  if (registering_.load()) options_asked_ = true;
}

bool KubeletEndpoint::kubelet_may_reallocate_running() const { return kubelet_sync_.load() == 0; }

void KubeletEndpoint::SetCallSettings(absl::Duration backend_timeout, bool cdi_annotations) {
  backend_timeout_ns_ = absl::ToInt64Nanoseconds(backend_timeout);
  cdi_annotations_ = cdi_annotations;
}

bool KubeletEndpoint::SocketPresent() {
  absl::MutexLock lock(&mu_);
  return server_ != nullptr && served_id_.has_value() && StatFileId(socket_path_) == served_id_;
}

absl::Status KubeletEndpoint::Serve() {
  DPP_RETURN_IF_ERROR(ValidateSocketPath(socket_path_));
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::CancelledError("stopping");
  FinishStreams();  // streams of the old server end
  // The old server finishes the calls it is answering (for up to a
  // second) before it goes, so a kubelet's GetDevicePluginOptions in flight
  // on it is answered, not cancelled. It must go before the new one
  // listens: gRPC unlinks a server's path when it shuts down.
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
  }
  services_->unknown.reset();  // served only that server
  size_t slash = socket_path_.rfind('/');
  DPP_RETURN_IF_ERROR(MakeDirs(socket_path_.substr(0, slash)));
  std::vector<std::string> served = {"v1beta1.DevicePlugin", "deviceplugin.DevicePlugin"};
  grpc::ServerBuilder builder;
  // One idle thread for GetDevicePluginOptions, the one synchronous method
  // (see Services::Beta); a second while one answers.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
  builder.AddListeningPort(UnixAddress(socket_path_), grpc::InsecureServerCredentials());
  builder.RegisterService(&services_->beta);
  builder.RegisterService(&services_->alpha);
  if (options_.registration == KubeletRegistration::kPluginWatcher) {
    builder.RegisterService(&services_->watcher);
    served.push_back("pluginregistration.Registration");
  }
  services_->unknown = std::make_unique<GoStyleUnknownHandler>(served);
  builder.RegisterCallbackGenericService(services_->unknown.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    served_id_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", socket_path_));
  }
  // Only the kubelet (root) may connect, whatever the umask.
  if (absl::Status m = SetMode(socket_path_, 0700); !m.ok()) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
    served_id_.reset();
    return m;
  }
  served_id_ = StatFileId(socket_path_);
  return absl::OkStatus();
}

absl::Status KubeletEndpoint::ReleaseClientName(absl::Duration timeout) {
  absl::MutexLock serial(&register_serial_mu_);
  if (stopping_) return absl::CancelledError("stopping");
  absl::Status s = dpproxy::ReleaseClientName(options_, resource_->name(), socket_name_, timeout);
  if (s.ok()) {
    unlisted_ = true;
    events_->Emit("kubelet_client_name_released", {{"resource", resource_->name()},
                                                   {"socket", socket_path_}});
  }
  return s;
}

void KubeletEndpoint::RelistBeforeStop() {
  if (!unlisted_.load() || !kubelet_streaming()) return;
  if (absl::Status s = Register(); !s.ok()) {
    LOG(WARNING) << "resource " << resource_->name() << ": could not register once more before "
                 << "stopping (" << s.message() << "); the kubelet may count the devices "
                 << "healthy until it restarts";
  }
}

absl::Status KubeletEndpoint::Register() {
  if (options_.registration == KubeletRegistration::kPluginWatcher) return absl::OkStatus();
  absl::MutexLock serial(&register_serial_mu_);
  const std::string kubelet = KubeletSocketPath(options_);
  // kubelet.sock appears (bind) a moment before the kubelet listens on it:
  // DialUnixChannel does not wait out gRPC's reconnect timer after that
  // refusal (it fired 101 ms late: the slowest re-registrations).
  absl::StatusOr<std::shared_ptr<grpc::Channel>> dialled =
      DialUnixChannel(kubelet, absl::Seconds(2), [this] { return stopping_.load(); });
  if (!dialled.ok()) {
    if (absl::IsCancelled(dialled.status())) return absl::CancelledError("stopping");
    return absl::UnavailableError(absl::StrCat("kubelet socket ", kubelet, " is not answering"));
  }
  std::shared_ptr<grpc::Channel> channel = *std::move(dialled);
  std::vector<ApiVersion> tries;
  if (!options_.api || options_.api == ApiVersion::kV1Beta1) {
    tries.push_back(ApiVersion::kV1Beta1);
  }
  if (!options_.api || options_.api == ApiVersion::kV1Alpha) {
    tries.push_back(ApiVersion::kV1Alpha);
  }
  std::vector<std::string> refusals;
  for (ApiVersion api : tries) {
    grpc::ClientContext ctx;
    // A 1.25+ kubelet dials back before answering, for up to 10 s.
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(15)));
    {
      absl::MutexLock lock(&register_mu_);
      if (stopping_) return absl::CancelledError("stopping");
      register_ctx_ = &ctx;
    }
    struct Clear {
      KubeletEndpoint* e;
      ~Clear() {
        absl::MutexLock lock(&e->register_mu_);
        e->register_ctx_ = nullptr;
      }
    } clear{this};
    grpc::Status st;
    std::string version;
    registering_ = true;
    options_asked_ = false;
    if (api == ApiVersion::kV1Beta1) {
      version = std::string(kV1Beta1Version);
      v1beta1::RegisterRequest req;
      req.set_version(version);
      req.set_endpoint(socket_name_);
      req.set_resource_name(resource_->name());
      *req.mutable_options() = resource_->options();
      v1beta1::Empty resp;
      st = v1beta1::Registration::NewStub(channel)->Register(&ctx, req, &resp);
    } else {
      version = std::string(kV1AlphaVersion);
      deviceplugin::RegisterRequest req;
      req.set_version(version);
      req.set_endpoint(socket_name_);
      req.set_resource_name(resource_->name());
      deviceplugin::Empty resp;
      st = deviceplugin::Registration::NewStub(channel)->Register(&ctx, req, &resp);
    }
    registering_ = false;
    if (st.ok()) {
      // A 1.25+ kubelet dials back and asks for the options before it
      // answers; older ones answer first.
      kubelet_sync_ = options_asked_.load() ? 1 : 0;
      unlisted_ = false;
      SetNegotiated(version);
      std::shared_ptr<Backend> b = resource_->backend();
      LOG(INFO) << "resource " << resource_->name() << ": registered with the kubelet as "
                << version << " (backend "
                << (b ? std::string(ApiWireVersion(b->api())) + " at " + b->endpoint() : "not connected")
                << ")";
      events_->Emit("kubelet_registered",
                    {{"resource", resource_->name()},
                     {"kubelet_api", version},
                     {"backend_api", b ? std::string(ApiWireVersion(b->api())) : ""},
                     {"socket", socket_path_},
                     {"refused_first", refusals}});
      return absl::OkStatus();
    }
    refusals.push_back(absl::StrCat(version, ": ", DescribeGrpcStatus(st)));
    const bool next = st.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
                      (st.error_code() == grpc::StatusCode::UNKNOWN &&
                       absl::StrContains(st.error_message(), "is not supported by kubelet"));
    if (!next) break;
    LOG(INFO) << "resource " << resource_->name() << ": kubelet refused " << version << " ("
              << DescribeGrpcStatus(st) << "); trying the next version";
  }
  std::string why = absl::StrJoin(refusals, "; ");
  LOG(ERROR) << "resource " << resource_->name() << ": kubelet registration failed: " << why;
  events_->Emit("kubelet_registration_failed",
                {{"resource", resource_->name()}, {"error", why}});
  return absl::FailedPreconditionError(
      absl::StrCat("the kubelet at ", kubelet, " refused every version tried: ", why));
}

namespace {
// A journal's refusal as the kubelet gets it.
grpc::Status JournalStatus(const absl::Status& s, const std::string& resource) {
  if (s.ok()) return grpc::Status::OK;
  if (s.code() == absl::StatusCode::kFailedPrecondition) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, std::string(s.message()));
  }
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat("dpproxy cannot persist the allocation for ", resource,
                                   ", so it refuses it: ", s.message()));
}
}  // namespace

AllocationJournal::Reservation KubeletEndpoint::Reserve(
    const v1beta1::AllocateRequest& req, const v1beta1::AllocateRequest* backend_req,
    const Backend& backend, std::function<void(grpc::Status)> durable, bool readmission) {
  if (journal_ == nullptr) {
    durable(grpc::Status::OK);
    return {};
  }
  return journal_->ReserveAsync(
      resource_->name(), req,
      BackendSide{std::string(ApiWireVersion(backend.api())), backend.endpoint(),
                  backend.resource(), backend_req},
      [durable = std::move(durable), name = resource_->name()](absl::Status s) {
        durable(JournalStatus(s, name));
      },
      readmission);
}

void KubeletEndpoint::Answer(const AllocationJournal::Reservation& r,
                             const v1beta1::AllocateResponse& resp,
                             std::function<void(grpc::Status)> done) {
  if (journal_ == nullptr) {
    done(grpc::Status::OK);
    return;
  }
  journal_->AnswerAsync(r, resp, [done = std::move(done), name = resource_->name()](
                                     absl::Status s) { done(JournalStatus(s, name)); });
}

void KubeletEndpoint::Withdraw(const AllocationJournal::Reservation& r) {
  if (journal_ != nullptr) journal_->Withdraw(r);
}

void KubeletEndpoint::HoldAllocates() {
  absl::MutexLock lock(&gate_mu_);
  allocate_mode_ = AllocateMode::kHold;
}

bool KubeletEndpoint::WaitForAllocatesServed(absl::Duration timeout) {
  absl::MutexLock lock(&gate_mu_);
  return gate_mu_.AwaitWithTimeout(
      absl::Condition(
          +[](int* n) { return *n == 0; }, &allocates_in_progress_),
      timeout);
}

size_t KubeletEndpoint::ForwardAllocates(const std::string& socket) {
  std::map<const void*, std::function<void()>> held;
  {
    absl::MutexLock lock(&gate_mu_);
    allocate_mode_ = AllocateMode::kForward;
    forward_stub_ = v1beta1::DevicePlugin::NewStub(MakeUnixChannel(socket));
    held.swap(held_);
  }
  LOG(INFO) << "resource " << resource_->name() << ": Allocates go on to " << socket << " ("
            << held.size() << " held)";
  for (auto& [key, resume] : held) resume();
  return held.size();
}

void KubeletEndpoint::ServeAllocates() {
  std::map<const void*, std::function<void()>> held;
  {
    absl::MutexLock lock(&gate_mu_);
    allocate_mode_ = AllocateMode::kServe;
    forward_stub_.reset();
    held.swap(held_);
  }
  for (auto& [key, resume] : held) resume();
}

KubeletEndpoint::AllocateMode KubeletEndpoint::AdmitAllocate(
    const void* key, std::function<void()> resume,
    std::shared_ptr<v1beta1::DevicePlugin::Stub>* forward_to) {
  absl::MutexLock lock(&gate_mu_);
  switch (allocate_mode_) {
    case AllocateMode::kServe:
      ++allocates_in_progress_;
      break;
    case AllocateMode::kHold:
      held_.emplace(key, std::move(resume));
      break;
    case AllocateMode::kForward:
      ++allocates_in_progress_;
      *forward_to = forward_stub_;
      break;
  }
  return allocate_mode_;
}

bool KubeletEndpoint::Unhold(const void* key) {
  absl::MutexLock lock(&gate_mu_);
  return held_.erase(key) > 0;
}

void KubeletEndpoint::AllocateServed() {
  absl::MutexLock lock(&gate_mu_);
  --allocates_in_progress_;
}

bool KubeletEndpoint::kubelet_streaming() {
  absl::MutexLock lock(&streams_mu_);
  return !streams_.empty();
}

bool KubeletEndpoint::WaitForKubeletGone(absl::Duration timeout) {
  absl::MutexLock lock(&streams_mu_);
  auto gone = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(streams_mu_) { return streams_.empty(); };
  return streams_mu_.AwaitWithTimeout(absl::Condition(&gone), timeout);
}

void KubeletEndpoint::AddStream(StreamHandle* s) {
  absl::MutexLock lock(&streams_mu_);
  streams_.insert(s);
}

void KubeletEndpoint::RemoveStream(StreamHandle* s, bool by_kubelet) {
  bool dropped;
  {
    absl::MutexLock lock(&streams_mu_);
    streams_.erase(s);
    dropped = by_kubelet && streams_.empty() && !stopping_.load();
  }
  if (dropped && stream_dropped_) stream_dropped_();
}

void KubeletEndpoint::FinishStreams() {
  // Under streams_mu_: a stream leaves the set (in OnDone) only after its
  // finish, and is deleted after that, so none is finished after deletion.
  absl::MutexLock lock(&streams_mu_);
  for (StreamHandle* s : streams_) s->FinishNow();
}

std::string KubeletEndpoint::negotiated() {
  absl::MutexLock lock(&negotiated_mu_);
  return negotiated_;
}

void KubeletEndpoint::SetNegotiated(const std::string& v) {
  absl::MutexLock lock(&negotiated_mu_);
  if (negotiated_ != v) {
    negotiated_ = v;
    if (absl::StrContains(v, "plugin-watcher")) {
      LOG(INFO) << "resource " << resource_->name()
                << ": registered with the kubelet through the plugin watcher";
      events_->Emit("kubelet_registered", {{"resource", resource_->name()},
                                           {"kubelet_api", v},
                                           {"socket", socket_path_}});
    }
  }
}

void KubeletEndpoint::NoteLoss(const Loss& loss) {
  for (const std::string& kind : losses_->Add(resource_->name(), loss)) {
    LOG(WARNING) << "resource " << resource_->name() << ": the kubelet's API (v1alpha) has no "
                 << kind << "; dropping them (logged once per resource, counted)";
    events_->Emit("lossy_translation", {{"resource", resource_->name()},
                                        {"kind", kind},
                                        {"kubelet_api", "v1alpha2"}});
  }
}

void KubeletEndpoint::Stop() {
  {
    absl::MutexLock lock(&register_mu_);
    stopping_ = true;
    if (register_ctx_ != nullptr) register_ctx_->TryCancel();
  }
  FinishStreams();
  absl::MutexLock lock(&mu_);
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
    ::unlink(socket_path_.c_str());
  }
}

}  // namespace dpproxy
