// DevicePluginServer's gRPC side: the services the kubelet calls (ListAndWatch
// streams, the Allocate reactor, GetPreferredAllocation, PreStartContainer,
// the plugin watcher's GetInfo), the server that serves them, and the
// endpoint's construction. Registration and the hand-over of calls are in
// device_plugin_server.cc.
#include "proxy/kubelet_side/device_plugin/device_plugin_server.h"

#include <errno.h>
#include <unistd.h>

#include <thread>

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
#include "proxy/kubelet_side/device_plugin/client_name_release.h"
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
// (DevicePluginServer::FinishStreams), and deletes itself when gRPC is done.
template <typename Msg>
class ListAndWatchStream final : public NewestWriter<Msg>, public DevicePluginServer::StreamHandle {
 public:
  // Makes the message for a published list (the version the kubelet
  // speaks).
  using Translate = std::function<std::shared_ptr<const Msg>(const Resource::Snapshot&)>;

  ListAndWatchStream(DevicePluginServer* e, Translate translate)
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

  DevicePluginServer* const e_;
  const Translate translate_;
  uint64_t watcher_ = 0;
};

// --- Timing -------------------------------------------------------------------------

// Times one kubelet-side call from its start to Done(), which passes the
// answer's status through.
class KubeletCall {
 public:
  KubeletCall(DevicePluginServer* e, const char* method, ApiVersion kubelet_api)
      : e_(e), method_(method), kubelet_api_(kubelet_api), start_(absl::Now()) {}
  // The backend that served it, for the backend_api label.
  void set_backend(const Backend* b) { backend_api_ = b->api(); }
  grpc::Status Done(grpc::Status s) {
    // What the kubelet turns into a failed pod: said once, at warning.
    if (!s.ok()) {
      LOG(WARNING) << "resource " << e_->resource()->name() << ": " << method_
                   << " from the kubelet (" << ApiWireVersion(kubelet_api_) << ") answered "
                   << GrpcCodeName(s.error_code()) << ": " << s.error_message();
    }
    if (e_->telemetry() != nullptr) {
      e_->telemetry()->ObserveRpc(
          "kubelet", method_, e_->resource()->name(), ApiWireVersion(kubelet_api_),
          backend_api_.has_value() ? ApiWireVersion(*backend_api_) : absl::string_view(),
          GrpcCodeName(s.error_code()), absl::Now() - start_);
    }
    return s;
  }

 private:
  DevicePluginServer* const e_;
  const char* const method_;
  const ApiVersion kubelet_api_;
  const absl::Time start_;
  std::optional<ApiVersion> backend_api_;
};

// --- Allocate -----------------------------------------------------------------------

// An Allocate from the kubelet, whatever API it speaks (its edge translates
// the request in and the response out): admitted by the handoff gate
// (served here, held, or sent on to a new dpproxy), served by the
// resource's allocator (allocator.h: every rule and the journal), and
// answered with CDI names copied into annotations where asked.
//
// Served with gRPC's callback API: no thread waits on the call, and the
// reactor deletes itself once gRPC is done with it.
class AllocateReactor final : public grpc::ServerUnaryReactor {
 public:
  // Writes the core's answer into the kubelet's response message.
  using Answer = std::function<void(v1beta1::AllocateResponse)>;

  // Starts serving `req`; the reactor is gRPC's from then on.
  static grpc::ServerUnaryReactor* Start(DevicePluginServer* e, grpc::CallbackServerContext* ctx,
                                         ApiVersion kubelet_api, v1beta1::AllocateRequest req,
                                         Answer answer) {
    auto* r = new AllocateReactor(e, ctx, kubelet_api, std::move(req), std::move(answer));
    r->Begin();
    return r;
  }

  // The allocator's call ends with the kubelet's (through its context); a
  // held call ends at once.
  void OnCancel() override {
    if (e_->Unhold(this)) End(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }
  // Both reactions are short and never block (a map lookup under the
  // endpoint's lock, a Finish), so gRPC may run them on the thread that
  // ends the call. Otherwise it hands every call's end to its executor
  // thread: a thread hop per Allocate, about 10 us of CPU per call on a
  // 2-core machine (tools/dev bench, "CPU time per call"). gRPC's own reactor for
  // CallbackServerContext::DefaultReactor() says the same of itself; the
  // hook is public but marked internal in gRPC 1.51's headers, so a gRPC
  // that drops it fails this build rather than changing behaviour.
  bool InternalInlineable() override { return true; }

 private:
  AllocateReactor(DevicePluginServer* e, grpc::CallbackServerContext* ctx, ApiVersion kubelet_api,
                  v1beta1::AllocateRequest req, Answer answer)
      : e_(e),
        ctx_(ctx),
        kubelet_api_(kubelet_api),
        req_(std::move(req)),
        containers_(req_.container_requests_size()),
        answer_(std::move(answer)),
        call_(e, "Allocate", kubelet_api),
        timeout_(e->backend_timeout()),
        deadline_(absl::Now() + timeout_) {}

  void Begin() {
    // A handoff may hold the call, or send it on to the new dpproxy.
    std::shared_ptr<v1beta1::DevicePlugin::Stub> forward_to;
    switch (e_->AdmitAllocate(this, [this] { Begin(); }, &forward_to)) {
      case DevicePluginServer::AllocateMode::kHold:
        return;  // Begin() runs again when the handoff moves on
      case DevicePluginServer::AllocateMode::kForward:
        counted_ = true;
        return Forward(std::move(forward_to));
      case DevicePluginServer::AllocateMode::kServe:
        counted_ = true;
        break;
    }
    Allocator::Call call;
    call.request = std::move(req_);  // served here: the reactor needs it no more
    call.timeout = timeout_;
    call.caller = ctx_;
    call.kubelet_api = std::string(ApiWireVersion(kubelet_api_));
    // A 1.9 kubelet never calls PreStartContainer, nor one told it need
    // not (the backend was swapped for one that needs it, and a 1.25+
    // kubelet keeps the options it read when it dialled): the allocator
    // calls it, right after Allocate, within the same deadline, if the
    // backend asks for it.
    call.pre_start = kubelet_api_ == ApiVersion::kV1Alpha ||
                     e_->kubelet_calls_pre_start() == std::optional<bool>(false);
    call.readmission_possible = e_->kubelet_may_reallocate_running();
    // The last touch of this reactor here: the answer may arrive, and the
    // reactor end, on another thread before this call returns.
    e_->allocator()->Allocate(std::move(call), [this](absl::StatusOr<Allocator::Allocated> r) {
      if (!r.ok()) return End(ToGrpcStatus(r.status()));
      call_.set_backend(r->backend.get());
      Answered(std::move(r->response));
    });
  }

  void Answered(v1beta1::AllocateResponse resp) {
    Resource* res = e_->resource();
    // v1alpha has no annotations: adding them would only count a loss.
    if (e_->cdi_annotations() && kubelet_api_ == ApiVersion::kV1Beta1) {
      for (auto& c : *resp.mutable_container_responses()) {
        if (c.cdi_devices_size() == 0) continue;
        std::vector<std::string> names;
        for (const auto& d : c.cdi_devices()) names.push_back(d.name());
        (*c.mutable_annotations())[CdiAnnotationKey(res->name())] = absl::StrJoin(names, ",");
      }
    }
    e_->events()->EmitPerCall("allocate", res->name(), [&] {
      return Json{{"resource", res->name()},
                  {"kubelet_api", std::string(ApiWireVersion(kubelet_api_))},
                  {"containers", containers_}};
    });
    answer_(std::move(resp));
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

  void End(const grpc::Status& s) {
    if (counted_) e_->AllocateServed();
    Finish(call_.Done(s));
  }

  DevicePluginServer* const e_;
  grpc::CallbackServerContext* const ctx_;
  const ApiVersion kubelet_api_;
  v1beta1::AllocateRequest req_;  // the allocator's once served, else a forwarded call's
  const int containers_;
  const Answer answer_;
  KubeletCall call_;
  const absl::Duration timeout_;
  const absl::Time deadline_;  // a forwarded call's
  bool counted_ = false;  // admitted by the endpoint's gate, served or forwarded
  std::shared_ptr<v1beta1::DevicePlugin::Stub> forward_stub_;
  std::unique_ptr<grpc::ClientContext> forward_ctx_;
  v1beta1::AllocateResponse resp_;  // a forwarded call's answer
};

// --- GetPreferredAllocation -------------------------------------------------------

// Answers a GetPreferredAllocation from `picks` (the backend's, per
// container; empty if it has none) steering around `held` (preferred.h).
// If the answer must name held devices, the holders of every held device
// offered are checked first, once, on a thread of its own (it asks
// pod-resources): one gone since (its pod deleted a moment ago, before any
// reconciliation pass) frees its devices, and the answer is chosen again,
// so that a running holder's device is never named while a freed one is
// offered.
void FinishPreferred(DevicePluginServer* e, const v1beta1::PreferredAllocationRequest* req,
                     v1beta1::PreferredAllocationResponse* resp,
                     grpc::ServerUnaryReactor* reactor, std::shared_ptr<KubeletCall> call,
                     std::vector<std::vector<std::string>> picks,
                     std::shared_ptr<const Resource::Forgotten> held, bool refreshed) {
  std::vector<PreferredChoice> choices;
  bool names_held = false;
  for (int i = 0; i < req->container_requests_size(); ++i) {
    choices.push_back(ChoosePreferred(req->container_requests(i), picks[i], *held));
    names_held |= choices.back().held_named > 0;
  }
  if (names_held && !refreshed) {
    // Only holds of forgotten containers can have ended unseen (a claim's
    // ends with its unprepare).
    const std::shared_ptr<const Resource::Forgotten> forgotten = e->resource()->forgotten();
    std::vector<std::string> offered;
    for (const auto& c : req->container_requests()) {
      for (const std::string& id : c.available_deviceids()) {
        if (forgotten->count(id) > 0) offered.push_back(id);
      }
    }
    if (!offered.empty()) {
      std::thread([e, req, resp, reactor, call = std::move(call), picks = std::move(picks),
                   held = std::move(held), offered = std::move(offered)]() mutable {
        const std::set<std::string> still = e->resource()->StillForgotten(offered);
        auto fresh = std::make_shared<Resource::Forgotten>(*held);
        for (const std::string& id : offered) {
          if (still.count(id) == 0) fresh->erase(id);
        }
        FinishPreferred(e, req, resp, reactor, std::move(call), std::move(picks),
                        std::move(fresh), /*refreshed=*/true);
      }).detach();
      return;  // the call is not finished before the thread answers: req, resp live
    }
  }
  for (PreferredChoice& choice : choices) {
    e->NoteSteering(choice);
    auto* out = resp->add_container_responses();
    for (std::string& id : choice.ids) out->add_deviceids(std::move(id));
  }
  reactor->Finish(call->Done(grpc::Status::OK));
}

// --- Services ---------------------------------------------------------------------

class DevicePluginServer::Services {
 public:
  // Every method is served with gRPC's callback API, so that no server
  // has a pool of synchronous threads of its own (two per resource).
  class Beta final
      : public v1beta1::DevicePlugin::WithRawCallbackMethod_ListAndWatch<
            v1beta1::DevicePlugin::WithCallbackMethod_GetPreferredAllocation<
                v1beta1::DevicePlugin::WithCallbackMethod_Allocate<
                    v1beta1::DevicePlugin::WithCallbackMethod_PreStartContainer<
                        v1beta1::DevicePlugin::WithCallbackMethod_GetDevicePluginOptions<
                            v1beta1::DevicePlugin::Service>>>>> {
   public:
    explicit Beta(DevicePluginServer* e) : e_(e) {}

    // From memory, at once.
    grpc::ServerUnaryReactor* GetDevicePluginOptions(grpc::CallbackServerContext* ctx,
                                                     const v1beta1::Empty*,
                                                     v1beta1::DevicePluginOptions* resp) override {
      KubeletCall call(e_, "GetDevicePluginOptions", ApiVersion::kV1Beta1);
      e_->NoteOptionsAsked();
      *resp = e_->resource()->options();
      e_->NoteOptionsTold(*resp);
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      reactor->Finish(call.Done(grpc::Status::OK));
      return reactor;
    }

    // Raw: the published list is held as the v1beta1 message's bytes, which
    // every stream writes as they are (never serialized again, never copied).
    grpc::ServerWriteReactor<grpc::ByteBuffer>* ListAndWatch(grpc::CallbackServerContext*,
                                                             const grpc::ByteBuffer*) override {
      return new ListAndWatchStream<grpc::ByteBuffer>(e_, [](const Resource::Snapshot& s) {
        return WireBuffer(s.to_device_plugins->shared_wire());
      });
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
      DevicePluginServer* e = e_;
      Resource* res = e->resource();
      if (!res->forgotten()->empty() && e->kubelet_may_reallocate_running()) {
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
      // Steered around: devices the kubelet forgot, and those claims made
      // for pods of the extended resource hold.
      std::shared_ptr<const Resource::Forgotten> held = res->steer_around();
      if (!res->backend_offers_preferred()) {
        FinishPreferred(e, req, resp, reactor, call,
                        std::vector<std::vector<std::string>>(req->container_requests_size()),
                        std::move(held), /*refreshed=*/false);
        return reactor;
      }
      e->allocator()->WithBackend(ctx, e->backend_timeout(), [e, ctx, req, resp, reactor, call,
                           held = std::move(held)](std::shared_ptr<Backend> b) {
        if (b == nullptr) return reactor->Finish(call->Done(ToGrpcStatus(e->allocator()->NoBackend())));
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
              e->allocator()->ObserveBackendCall("GetPreferredAllocation",
                                                 ApiWireVersion(ApiVersion::kV1Beta1), *b,
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
      DevicePluginServer* e = e_;
      e->allocator()->WithBackend(ctx, e->backend_timeout(), [e, ctx, req, reactor, call](std::shared_ptr<Backend> b) {
        if (b == nullptr) return reactor->Finish(call->Done(ToGrpcStatus(e->allocator()->NoBackend())));
        call->set_backend(b.get());
        // A backend that does not ask for it (the kubelet was told so for
        // the one before) has nothing to do here.
        if (!b->options().pre_start_required()) return reactor->Finish(call->Done(grpc::Status::OK));
        v1beta1::PreStartContainerRequest breq = *req;
        for (auto& id : *breq.mutable_devices_ids()) id = e->resource()->ToBackendId(id);
        const absl::Time start = absl::Now();
        Backend* backend = b.get();
        backend->PreStartContainerAsync(
            std::move(breq), e->backend_timeout(), ctx,
            [e, reactor, call, b = std::move(b), start](absl::Status s) {
              e->allocator()->ObserveBackendCall(
                  "PreStartContainer", ApiWireVersion(ApiVersion::kV1Beta1), *b, s, start);
              reactor->Finish(call->Done(ToGrpcStatus(s)));
            });
      });
      return reactor;
    }

   private:
    DevicePluginServer* const e_;
  };

  class Alpha final : public deviceplugin::DevicePlugin::WithCallbackMethod_ListAndWatch<
                          deviceplugin::DevicePlugin::WithCallbackMethod_Allocate<
                              deviceplugin::DevicePlugin::Service>> {
   public:
    explicit Alpha(DevicePluginServer* e) : e_(e) {}

    grpc::ServerWriteReactor<deviceplugin::ListAndWatchResponse>* ListAndWatch(
        grpc::CallbackServerContext*, const deviceplugin::Empty*) override {
      DevicePluginServer* e = e_;
      return new ListAndWatchStream<deviceplugin::ListAndWatchResponse>(
          e, [e](const Resource::Snapshot& s) {
            Loss loss;
            auto out = std::make_shared<const deviceplugin::ListAndWatchResponse>(
                ToV1AlphaList(s.to_device_plugins->ToMessage(), &loss));
            e->NoteLoss(loss);
            return out;
          });
    }

    // The edge only translates: v1alpha in, the one core, v1alpha out.
    grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* ctx,
                                       const deviceplugin::AllocateRequest* req,
                                       deviceplugin::AllocateResponse* resp) override {
      DevicePluginServer* e = e_;
      return AllocateReactor::Start(e, ctx, ApiVersion::kV1Alpha, FromV1AlphaAllocate(*req),
                                    [e, resp](v1beta1::AllocateResponse r) {
                                      Loss loss;
                                      *resp = ToV1AlphaResponse(r.container_responses(0), &loss);
                                      e->NoteLoss(loss);
                                    });
    }

   private:
    DevicePluginServer* const e_;
  };

  class Watcher final : public pluginregistration::Registration::WithCallbackMethod_GetInfo<
                            pluginregistration::Registration::WithCallbackMethod_NotifyRegistrationStatus<
                                pluginregistration::Registration::Service>> {
   public:
    explicit Watcher(DevicePluginServer* e) : e_(e) {}
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

    DevicePluginServer* const e_;
  };

  explicit Services(DevicePluginServer* e) : beta(e), alpha(e), watcher(e) {}
  Beta beta;
  Alpha alpha;
  Watcher watcher;
  // A callback generic service serves one server in its life: one per Serve().
  std::unique_ptr<GoStyleUnknownHandler> unknown;
};

// --- Construction and the server ------------------------------------------------

DevicePluginServer::DevicePluginServer(Resource* resource, const KubeletSideOptions& options,
                                       LossCounter* losses, EventLog* events,
                                       Allocator* allocator, Telemetry* telemetry)
    : resource_(resource),
      options_(options),
      backend_timeout_ns_(absl::ToInt64Nanoseconds(options.backend_timeout)),
      cdi_annotations_(options.cdi_annotations),
      losses_(losses),
      events_(events),
      allocator_(allocator),
      telemetry_(telemetry),
      socket_name_(SocketNameFor(resource->name(), options.socket_generation)),
      socket_path_(options.registration == KubeletRegistration::kPluginWatcher
                       ? JoinPath(JoinPath(options.kubelet_root, "plugins_registry"), socket_name_)
                       : JoinPath(DevicePluginDir(options), socket_name_)),
      services_(std::make_unique<Services>(this)) {}

DevicePluginServer::~DevicePluginServer() { Stop(); }

absl::Status DevicePluginServer::Serve() {
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
  // Counted before the new server listens: a kubelet's dial-back that
  // reaches it is noted as reaching this serve (NoteOptionsAsked).
  ++serves_;
  size_t slash = socket_path_.rfind('/');
  DPP_RETURN_IF_ERROR(MakeDirs(socket_path_.substr(0, slash)));
  std::vector<std::string> served = {"v1beta1.DevicePlugin", "deviceplugin.DevicePlugin"};
  // Every method is a callback one (see Services): the server has no
  // synchronous threads.
  grpc::ServerBuilder builder;
  builder.RegisterService(&services_->beta);
  builder.RegisterService(&services_->alpha);
  if (options_.registration == KubeletRegistration::kPluginWatcher) {
    builder.RegisterService(&services_->watcher);
    served.push_back("pluginregistration.Registration");
  }
  services_->unknown = std::make_unique<GoStyleUnknownHandler>(served);
  builder.RegisterCallbackGenericService(services_->unknown.get());
  // Only the kubelet (root) may connect, whatever the umask.
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = StartServerAt(builder, socket_path_, 0700);
  if (!server.ok()) {
    served_id_.reset();
    return server.status();
  }
  server_ = *std::move(server);
  served_id_ = StatFileId(socket_path_);
  return absl::OkStatus();
}

}  // namespace dpproxy
