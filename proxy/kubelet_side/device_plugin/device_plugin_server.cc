// DevicePluginServer's registration with the kubelet, the hold and hand-over of
// its calls during a takeover, and its streams' bookkeeping. The services
// and the server are in device_plugin_server_services.cc.
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

void DevicePluginServer::NoteSteering(const PreferredChoice& choice) {
  if (choice.avoided > 0) avoided_ += choice.avoided;
  if (choice.held_named > 0) {
    held_named_ += choice.held_named;
    LOG(WARNING) << "resource " << resource_->name() << ": a GetPreferredAllocation had to name "
                 << choice.held_named
                 << " device(s) held by containers the kubelet forgot or by claims of pods of the "
                    "extended resource (too few others are available); an Allocate naming them "
                    "is refused while their holders run";
  }
}


void DevicePluginServer::NoteOptionsAsked() {
  if (!registering_.load()) return;
  options_asked_serve_ = serves_.load();
  options_asked_ = true;
}

bool DevicePluginServer::kubelet_may_reallocate_running() const {
  return kubelet_sync_.load() == 0;
}

void DevicePluginServer::SetCallSettings(absl::Duration backend_timeout, bool cdi_annotations) {
  backend_timeout_ns_ = absl::ToInt64Nanoseconds(backend_timeout);
  cdi_annotations_ = cdi_annotations;
}

bool DevicePluginServer::SocketPresent() {
  absl::MutexLock lock(&mu_);
  return server_ != nullptr && served_id_.has_value() && StatFileId(socket_path_) == served_id_;
}


absl::Status DevicePluginServer::ReleaseClientName(absl::Duration timeout) {
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

void DevicePluginServer::RelistBeforeStop() {
  if (!unlisted_.load() || !kubelet_streaming()) return;
  absl::StatusOr<std::unique_ptr<Relist>> r =
      Relist::Register(options_, resource_->name(), socket_name_, resource_->options(),
                       resource_->Current().to_device_plugins->ToMessage(), absl::Seconds(5));
  if (!r.ok()) {
    LOG(WARNING) << "resource " << resource_->name() << ": could not register once more before "
                 << "stopping (" << r.status().message() << "); the kubelet may count the "
                 << "devices healthy until it restarts";
    return;
  }
  absl::MutexLock lock(&mu_);
  relist_ = *std::move(r);
}

grpc::Status DevicePluginServer::SendRegister(ApiVersion api,
                                              const std::shared_ptr<grpc::Channel>& channel,
                                              grpc::ClientContext* ctx) {
  if (api == ApiVersion::kV1Beta1) {
    v1beta1::RegisterRequest req;
    req.set_version(std::string(kV1Beta1Version));
    req.set_endpoint(socket_name_);
    req.set_resource_name(resource_->name());
    *req.mutable_options() = resource_->options();
    // A kubelet before 1.25 reads them here (a later one asks for them).
    NoteOptionsTold(req.options());
    v1beta1::Empty resp;
    return v1beta1::Registration::NewStub(channel)->Register(ctx, req, &resp);
  }
  deviceplugin::RegisterRequest req;
  req.set_version(std::string(kV1AlphaVersion));
  req.set_endpoint(socket_name_);
  req.set_resource_name(resource_->name());
  deviceplugin::Empty resp;
  return deviceplugin::Registration::NewStub(channel)->Register(ctx, req, &resp);
}

void DevicePluginServer::NoteRegistered(const std::string& version,
                                        const std::vector<std::string>& refusals) {
  std::shared_ptr<Backend> b = resource_->backend();
  LOG(INFO) << "resource " << resource_->name() << ": registered with the kubelet as " << version
            << " (backend "
            << (b ? std::string(ApiWireVersion(b->api())) + " at " + b->endpoint()
                  : "not connected")
            << ")";
  events_->Emit("kubelet_registered", {{"resource", resource_->name()},
                                       {"kubelet_api", version},
                                       {"backend_api", b ? std::string(ApiWireVersion(b->api())) : ""},
                                       {"socket", socket_path_},
                                       {"refused_first", refusals}});
}

absl::Status DevicePluginServer::Register(std::optional<FileId>* reached) {
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
  // The socket just connected to: whatever the caller saw at kubelet.sock
  // before, a kubelet that made it anew since is the one this registers
  // with.
  if (reached != nullptr) *reached = StatFileId(kubelet);
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
      DevicePluginServer* e;
      ~Clear() {
        absl::MutexLock lock(&e->register_mu_);
        e->register_ctx_ = nullptr;
      }
    } clear{this};
    registering_ = true;
    options_asked_ = false;
    const std::string version(api == ApiVersion::kV1Beta1 ? kV1Beta1Version : kV1AlphaVersion);
    grpc::Status st = SendRegister(api, channel, &ctx);
    registering_ = false;
    if (st.ok()) {
      // A 1.25+ kubelet dials back and asks for the options before it
      // answers; older ones answer first.
      kubelet_sync_ = options_asked_.load() ? 1 : 0;
      unlisted_ = false;
      SetNegotiated(version);
      NoteRegistered(version, refusals);
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

void DevicePluginServer::HoldAllocates() { gate_.Hold(); }

bool DevicePluginServer::WaitForAllocatesServed(absl::Duration timeout) {
  return gate_.WaitForServed(timeout);
}

size_t DevicePluginServer::ForwardAllocates(const std::string& socket) {
  {
    absl::MutexLock lock(&forward_mu_);
    if (forward_stub_ == nullptr || forward_socket_ != socket) {
      forward_socket_ = socket;
      forward_stub_ = v1beta1::DevicePlugin::NewStub(MakeUnixChannel(socket));
    }
  }
  const size_t held = gate_.Forward(socket);
  LOG(INFO) << "resource " << resource_->name() << ": Allocates go on to " << socket << " ("
            << held << " held)";
  return held;
}

void DevicePluginServer::ServeAllocates() { gate_.Serve(); }

DevicePluginServer::AllocateMode DevicePluginServer::AdmitAllocate(
    const void* key, std::function<void()> resume,
    std::shared_ptr<v1beta1::DevicePlugin::Stub>* forward_to) {
  std::string socket;
  const AllocateMode mode = gate_.Admit(key, std::move(resume), &socket);
  if (mode == AllocateMode::kForward) {
    absl::MutexLock lock(&forward_mu_);
    *forward_to = forward_stub_;
  }
  return mode;
}

bool DevicePluginServer::Unhold(const void* key) { return gate_.Unhold(key); }

void DevicePluginServer::AllocateServed() { gate_.Done(); }

bool DevicePluginServer::kubelet_streaming() {
  absl::MutexLock lock(&streams_mu_);
  return !streams_.empty();
}

bool DevicePluginServer::WaitForKubeletGone(absl::Duration timeout) {
  absl::MutexLock lock(&streams_mu_);
  auto gone = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(streams_mu_) { return streams_.empty(); };
  return streams_mu_.AwaitWithTimeout(absl::Condition(&gone), timeout);
}

void DevicePluginServer::AddStream(StreamHandle* s) {
  absl::MutexLock lock(&streams_mu_);
  streams_.insert(s);
}

void DevicePluginServer::RemoveStream(StreamHandle* s, bool by_kubelet) {
  bool dropped;
  {
    absl::MutexLock lock(&streams_mu_);
    streams_.erase(s);
    dropped = by_kubelet && streams_.empty() && !stopping_.load();
  }
  if (dropped && stream_dropped_) stream_dropped_();
}

void DevicePluginServer::FinishStreams() {
  // Under streams_mu_: a stream leaves the set (in OnDone) only after its
  // finish, and is deleted after that, so none is finished after deletion.
  absl::MutexLock lock(&streams_mu_);
  for (StreamHandle* s : streams_) s->FinishNow();
}

std::string DevicePluginServer::negotiated() {
  absl::MutexLock lock(&negotiated_mu_);
  return negotiated_;
}

void DevicePluginServer::SetNegotiated(const std::string& v) {
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

void DevicePluginServer::NoteLoss(const Loss& loss) {
  for (const std::string& kind : losses_->Add(resource_->name(), loss)) {
    LOG(WARNING) << "resource " << resource_->name() << ": the kubelet's API (v1alpha) has no "
                 << kind << "; dropping them (logged once per resource, counted)";
    events_->Emit("lossy_translation", {{"resource", resource_->name()},
                                        {"kind", kind},
                                        {"kubelet_api", "v1alpha2"}});
  }
}

void DevicePluginServer::Stop() {
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
  relist_.reset();
}

}  // namespace dpproxy
