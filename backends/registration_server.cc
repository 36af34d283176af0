#include "backends/registration_server.h"

#include <sys/stat.h>

#include "backends/connect.h"

#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>
#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/util/files.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/util/status_macros.h"

namespace dpproxy {
namespace {

// Register on gRPC's callback API (RegisterAsync): a v1beta1 plugin's dial
// holds a thread of its registration's own, never one of gRPC's, and the
// dials in flight are bounded.
class BetaRegistration final
    : public v1beta1::Registration::WithCallbackMethod_Register<v1beta1::Registration::Service> {
 public:
  explicit BetaRegistration(BackendRegistrationServer* s) : s_(s) {}
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1beta1::RegisterRequest* r,
                                     v1beta1::Empty*) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    s_->RegisterAsync(ApiVersion::kV1Beta1, r->version(), r->endpoint(), r->resource_name(),
                      [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); },
                      r->has_options() ? std::make_optional(r->options()) : std::nullopt);
    return reactor;
  }

 private:
  BackendRegistrationServer* const s_;
};

class AlphaRegistration final : public deviceplugin::Registration::WithCallbackMethod_Register<
                                    deviceplugin::Registration::Service> {
 public:
  explicit AlphaRegistration(BackendRegistrationServer* s) : s_(s) {}
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const deviceplugin::RegisterRequest* r,
                                     deviceplugin::Empty*) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    s_->RegisterAsync(ApiVersion::kV1Alpha, r->version(), r->endpoint(), r->resource_name(),
                      [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); });
    return reactor;
  }

 private:
  BackendRegistrationServer* const s_;
};

}  // namespace

BackendRegistrationServer::BackendRegistrationServer(Options options, OnBackend on_backend,
                                                     EventLog* events)
    : options_(std::move(options)),
      dial_timeout_ns_(absl::ToInt64Nanoseconds(options_.dial_timeout)),
      on_backend_(std::move(on_backend)),
      events_(events) {}

BackendRegistrationServer::~BackendRegistrationServer() { Stop(); }

std::string BackendRegistrationServer::socket_path() const {
  return JoinPath(options_.dir, kKubeletSocketName);
}

absl::Status BackendRegistrationServer::Start() {
  DPP_RETURN_IF_ERROR(ValidateSocketPath(socket_path()));
  DPP_RETURN_IF_ERROR(MakeDirs(options_.dir));
  DPP_RETURN_IF_ERROR(CheckOwnDirectory(options_.dir));
  absl::StatusOr<std::vector<std::string>> removed = RemoveStaleSockets(options_.dir);
  if (!removed.ok()) return removed.status();
  if (!removed->empty()) {
    LOG(INFO) << "removed " << removed->size() << " stale socket(s) from " << options_.dir;
  }
  beta_service_ = std::make_unique<BetaRegistration>(this);
  alpha_service_ = std::make_unique<AlphaRegistration>(this);
  unknown_ = std::make_unique<GoStyleUnknownHandler>(
      std::vector<std::string>{"v1beta1.Registration", "deviceplugin.Registration"});
  {
    absl::MutexLock lock(&mu_);
    running_ = true;
  }
  grpc::ServerBuilder builder;
  builder.RegisterService(beta_service_.get());
  builder.RegisterService(alpha_service_.get());
  builder.RegisterCallbackGenericService(unknown_.get());
  // Plugins watch this socket: it appears once, with its mode.
  const bool grouped = options_.socket_gid != static_cast<gid_t>(-1);
  absl::StatusOr<std::unique_ptr<grpc::Server>> server =
      StartServerAt(builder, socket_path(), grouped ? 0660 : 0700, options_.socket_gid);
  if (!server.ok()) {
    absl::MutexLock lock(&mu_);
    running_ = false;
    return server.status();
  }
  server_ = *std::move(server);
  LOG(INFO) << "backend registration socket " << socket_path()
            << " accepts v1alpha (\"v1alpha2\") and v1beta1 plugins";
  events_->Emit("backend_registration_listening", {{"socket", socket_path()}});
  return absl::OkStatus();
}

void BackendRegistrationServer::Stop() {
  std::vector<std::unique_ptr<Dialer>> dialers;
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    running_ = false;
    dialers.swap(dialers_);
  }
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
  }
  for (auto& d : dialers) {
    if (d->thread.joinable()) d->thread.join();
  }
  {
    // Registrations still dialling end (their dial has a deadline) and leave.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &registering_));
  }
  ::unlink(socket_path().c_str());
}

void BackendRegistrationServer::RegisterAsync(ApiVersion api, std::string version,
                                              std::string endpoint, std::string resource,
                                              std::function<void(absl::Status)> done,
                                              std::optional<v1beta1::DevicePluginOptions>
                                                  registered_options) {
  // v1alpha is answered at once (its dial runs on a Dialer's thread).
  if (api == ApiVersion::kV1Alpha) return done(HandleRegister(api, version, endpoint, resource));
  bool stopping = false, busy = false;
  {
    absl::MutexLock lock(&mu_);
    stopping = !running_;
    busy = !stopping && registering_ >= static_cast<int>(kMaxDials);
    if (!stopping && !busy) ++registering_;
  }
  if (stopping) return done(absl::UnavailableError("dpproxy is stopping"));
  if (busy) {
    const absl::Status refused = absl::UnavailableError(absl::StrCat(
        kMaxDials, " v1beta1 plugins are being dialled already; register again shortly"));
    LOG(WARNING) << "backend registration of " << GoQuote(resource) << " (endpoint "
                 << GoQuote(endpoint) << ") refused: " << refused.message();
    CountRejection("busy");
    events_->Emit("backend_registration_rejected", {{"requested_resource", EchoField(resource)},
                                                    {"version", EchoField(version)},
                                                    {"endpoint", EchoField(endpoint)},
                                                    {"reason", "busy"},
                                                    {"error", std::string(refused.message())}});
    return done(refused);
  }
  // v1beta1 plugins are dialled before Register is answered (a refusal
  // names the reason), on a thread of this registration's own: the dial
  // blocks for up to the dial timeout.
  std::thread([this, api, version = std::move(version), endpoint = std::move(endpoint),
               resource = std::move(resource), done = std::move(done),
               registered_options = std::move(registered_options)] {
    done(HandleRegister(api, version, endpoint, resource, registered_options));
    absl::MutexLock lock(&mu_);
    --registering_;  // the thread's last touch of this server
  }).detach();
}

void BackendRegistrationServer::ReapDialersLocked() {
  for (auto it = dialers_.begin(); it != dialers_.end();) {
    if ((*it)->done) {
      (*it)->thread.join();  // it has returned or is returning
      it = dialers_.erase(it);
    } else {
      ++it;
    }
  }
}

void BackendRegistrationServer::CountRejection(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  ++rejections_[reason];
}

std::map<std::string, int64_t> BackendRegistrationServer::Rejections() {
  absl::MutexLock lock(&mu_);
  return rejections_;
}

namespace {

// What an endpoint names, checked the same way for both plugin versions
// and answered at once: something other than a socket there, or a
// directory that does not exist, can never be dialled. A socket that does
// not exist yet in an existing directory may still be served: a 1.25+
// kubelet waits for it up to its dial timeout, and so does dpproxy.
absl::Status CheckEndpointPath(const std::string& socket, const std::string& endpoint) {
  struct stat st;
  if (::stat(socket.c_str(), &st) == 0) {
    if (S_ISSOCK(st.st_mode)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "endpoint ", GoQuote(endpoint), " names ",
        S_ISDIR(st.st_mode) ? "a directory" : S_ISREG(st.st_mode) ? "a regular file" : "a file",
        ", not a socket"));
  }
  const std::string dir = socket.substr(0, socket.rfind('/'));
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "endpoint ", GoQuote(endpoint), ": directory ", dir,
        " does not exist (a plugin serves its socket before it registers)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BackendRegistrationServer::HandleRegister(
    ApiVersion api, const std::string& version, const std::string& endpoint,
    const std::string& resource,
    const std::optional<v1beta1::DevicePluginOptions>& registered_options) {
  // Untrusted input: quoted and bounded wherever it is echoed, and never a
  // metric label (rejections are counted by reason only).
  auto reject = [&](const char* reason, absl::Status s) {
    LOG(WARNING) << "backend registration of " << GoQuote(resource) << " (version "
                 << GoQuote(version) << ", endpoint " << GoQuote(endpoint)
                 << ") refused: " << s.message();
    CountRejection(reason);
    events_->Emit("backend_registration_rejected", {{"requested_resource", EchoField(resource)},
                                                    {"version", EchoField(version)},
                                                    {"endpoint", EchoField(endpoint)},
                                                    {"reason", reason},
                                                    {"error", std::string(s.message())}});
    return s;
  };
  absl::Status s = api == ApiVersion::kV1Alpha ? ValidateV1AlphaVersion(version)
                                              : ValidateV1Beta1Version(version);
  if (!s.ok()) return reject("version", s);
  if (s = ValidateResourceName(resource); !s.ok()) return reject("resource_name", s);
  if (s = ValidateEndpointName(endpoint); !s.ok()) return reject("endpoint", s);
  const std::string socket = JoinPath(options_.dir, endpoint);
  if (s = ValidateSocketPath(socket); !s.ok()) return reject("endpoint", s);
  if (s = CheckEndpointPath(socket, endpoint); !s.ok()) return reject("endpoint", s);

  if (api == ApiVersion::kV1Beta1) {
    // A Register without options is taken as the defaults, as kubelets
    // 1.10-1.24 took it (they read RegisterRequest.options and never call
    // GetDevicePluginOptions). dpproxy never asks: a plugin written for
    // those kubelets may die on a call it was never made (a Go handler
    // answering nil panics its generated server), and it works directly
    // with them.
    absl::StatusOr<std::shared_ptr<Backend>> b = ConnectBackend(
        resource, socket, api, absl::Nanoseconds(dial_timeout_ns_.load()),
        options_.max_list_bytes, registered_options.value_or(v1beta1::DevicePluginOptions()));
    if (!b.ok()) {
      return reject("dial", absl::UnknownError(
          absl::StrCat("failed to dial device plugin: ", b.status().message())));
    }
    if (s = on_backend_(*b); !s.ok()) {
      (*b)->Stop();
      return reject("attach", s);
    }
    return absl::OkStatus();
  }
  // v1alpha: answer now, dial afterwards (1.9 semantics).
  Dialer* raw = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("dpproxy is stopping");
    ReapDialersLocked();
    for (const auto& d : dialers_) {
      // Already being dialled: that dial picks up the plugin.
      if (d->socket == socket && !d->done) return absl::OkStatus();
    }
    if (dialers_.size() < kMaxDials) {
      dialers_.push_back(std::make_unique<Dialer>());
      raw = dialers_.back().get();
      raw->socket = socket;
    }
  }
  if (raw == nullptr) {
    return reject("busy", absl::UnavailableError(absl::StrCat(
        kMaxDials, " v1alpha plugins are being dialled already; register again shortly")));
  }
  // Started under the lock: Stop() either took `raw` already (then nothing
  // is started) or joins this thread.
  absl::MutexLock lock(&mu_);
  if (!running_) return absl::UnavailableError("dpproxy is stopping");
  raw->thread = std::thread([this, raw, resource, socket, api] {
    absl::StatusOr<std::shared_ptr<Backend>> b =
        ConnectBackend(resource, socket, api, absl::Nanoseconds(dial_timeout_ns_.load()),
                       options_.max_list_bytes);
    if (!b.ok()) {
      LOG(WARNING) << "v1alpha backend " << resource << " at " << socket
                   << " registered but cannot be reached: " << b.status().message();
      CountRejection("dial");
      events_->Emit("backend_dial_failed", {{"requested_resource", resource},
                                            {"endpoint", socket},
                                            {"error", std::string(b.status().message())}});
    } else if (absl::Status s = on_backend_(*b); !s.ok()) {
      (*b)->Stop();
      CountRejection("attach");
      events_->Emit("backend_registration_rejected", {{"requested_resource", resource},
                                                      {"reason", "attach"},
                                                      {"error", std::string(s.message())}});
    }
    absl::MutexLock done_lock(&mu_);
    raw->done = true;
  });
  return absl::OkStatus();
}

}  // namespace dpproxy
