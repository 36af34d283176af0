#include "proxy/kubelet_side/dra/dra_server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <grpcpp/server_builder.h>
#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "proto/dra/v1/api.grpc.pb.h"
#include "proto/dra/v1beta1/api.grpc.pb.h"
#include "proto/pluginregistration/api.grpc.pb.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

// A name from the kubelet as it came, unless it could not travel in a log
// or an event as it is (control characters, non-ASCII bytes, too long):
// then quoted and bounded.
std::string AsGiven(const std::string& s) {
  bool plain = s.size() <= 256;
  for (unsigned char ch : s) plain = plain && ch >= 0x20 && ch < 0x7f;
  return plain ? s : GoQuote(s);
}

// The one core for both packages (same messages, so templated on them).
template <typename Request, typename Response>
void PrepareAll(ClaimPreparer* p, EventLog* events, const grpc::ServerContextBase* ctx,
                const Request& req, Response* resp) {
  for (const auto& c : req.claims()) {
    auto& out = (*resp->mutable_claims())[c.uid()];
    absl::StatusOr<std::vector<PreparedClaimDevice>> d;
    try {
      d = p->Prepare({c.namespace_(), c.name(), c.uid()}, ctx);
    } catch (const std::exception& e) {
      // Nothing escapes to gRPC ("Unexpected error in RPC handling"): the
      // claim fails with what went wrong, the others go on.
      d = absl::InternalError(absl::StrCat("unexpected error preparing the claim: ", e.what()));
    }
    if (!d.ok()) {
      out.set_error(std::string(d.status().message()));
      LOG(WARNING) << "prepare failed: " << d.status().message();
      events->Emit("claim_prepare_failed",
                   {{"claim", AsGiven(absl::StrCat(c.namespace_(), "/", c.name()))},
                    {"uid", AsGiven(c.uid())},
                    {"error", std::string(d.status().message())}});
      continue;
    }
    for (const PreparedClaimDevice& pd : *d) {
      auto* dev = out.add_devices();
      for (const std::string& r : pd.requests) dev->add_request_names(r);
      dev->set_pool_name(pd.pool);
      dev->set_device_name(pd.device);
      for (const std::string& id : pd.cdi_ids) dev->add_cdi_device_ids(id);
    }
    events->Emit("claim_prepared", {{"claim", absl::StrCat(c.namespace_(), "/", c.name())},
                                    {"uid", c.uid()},
                                    {"devices", d->size()}});
  }
}

template <typename Request, typename Response>
void UnprepareAll(ClaimPreparer* p, EventLog* events, const Request& req, Response* resp) {
  for (const auto& c : req.claims()) {
    auto& out = (*resp->mutable_claims())[c.uid()];
    absl::Status s;
    try {
      s = p->Unprepare({c.namespace_(), c.name(), c.uid()});
    } catch (const std::exception& e) {
      s = absl::InternalError(absl::StrCat("unexpected error unpreparing the claim: ", e.what()));
    }
    if (!s.ok()) out.set_error(std::string(s.message()));
    events->Emit("claim_unprepared",
                 {{"claim", AsGiven(absl::StrCat(c.namespace_(), "/", c.name()))},
                  {"uid", AsGiven(c.uid())},
                  {"error", std::string(s.message())}});
  }
}

// A call the kubelet made here, sent on to a successor's service socket
// (a handoff) with the kubelet's deadline; the successor journals it.
template <typename Service, typename Request, typename Response>
grpc::Status ForwardCall(
    const std::string& socket,
    grpc::Status (Service::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    grpc::ServerContext* kubelet, const Request& req, Response* resp) {
  std::unique_ptr<typename Service::Stub> stub = Service::NewStub(MakeUnixChannel(socket));
  grpc::ClientContext ctx;
  ctx.set_deadline(kubelet->deadline());
  return (stub.get()->*method)(&ctx, req, resp);
}

// A call that is neither served nor forwarded: dpproxy stops, or it held
// the call for a new dpproxy until the kubelet's deadline.
grpc::Status Refused() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "dpproxy is stopping or handing over to a new dpproxy; the kubelet retries");
}

// One DRAPlugin service (v1 or v1beta1: the same messages in two
// packages) over the one core.
template <typename Api>
class DraService final : public Api::DRAPlugin::Service {
 public:
  using Stub = typename Api::DRAPlugin::Stub;
  DraService(DraServer* s, ClaimPreparer* p, EventLog* e) : s_(s), p_(p), e_(e) {}

  grpc::Status NodePrepareResources(grpc::ServerContext* ctx,
                                    const typename Api::NodePrepareResourcesRequest* req,
                                    typename Api::NodePrepareResourcesResponse* resp) override {
    return Gated(ctx, &Stub::NodePrepareResources, *req, resp,
                 [&] { PrepareAll(p_, e_, ctx, *req, resp); });
  }
  grpc::Status NodeUnprepareResources(grpc::ServerContext* ctx,
                                      const typename Api::NodeUnprepareResourcesRequest* req,
                                      typename Api::NodeUnprepareResourcesResponse* resp) override {
    return Gated(ctx, &Stub::NodeUnprepareResources, *req, resp,
                 [&] { UnprepareAll(p_, e_, *req, resp); });
  }

 private:
  // Through the server's gate (a handoff): served here with `serve`,
  // forwarded to a successor with `method`, or refused.
  template <typename Request, typename Response, typename Serve>
  grpc::Status Gated(grpc::ServerContext* ctx,
                     grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                     const Request& req, Response* resp, const Serve& serve) {
    std::string to;
    const CallGate::Admission admitted = s_->gate().AdmitWaiting(
        [ctx] { return ctx->IsCancelled(); }, absl::FromChrono(ctx->deadline()), &to);
    if (admitted == CallGate::Admission::kRefuse) return Refused();
    grpc::Status status = grpc::Status::OK;
    if (admitted == CallGate::Admission::kForward) {
      status = ForwardCall<typename Api::DRAPlugin>(to, method, ctx, req, resp);
    } else {
      serve();
    }
    s_->gate().Done();
    return status;
  }

  DraServer* const s_;
  ClaimPreparer* const p_;
  EventLog* const e_;
};

// The proto packages as types, for DraService.
struct ApiV1 {
  using DRAPlugin = drav1::DRAPlugin;
  using NodePrepareResourcesRequest = drav1::NodePrepareResourcesRequest;
  using NodePrepareResourcesResponse = drav1::NodePrepareResourcesResponse;
  using NodeUnprepareResourcesRequest = drav1::NodeUnprepareResourcesRequest;
  using NodeUnprepareResourcesResponse = drav1::NodeUnprepareResourcesResponse;
};
struct ApiV1Beta1 {
  using DRAPlugin = drav1beta1::DRAPlugin;
  using NodePrepareResourcesRequest = drav1beta1::NodePrepareResourcesRequest;
  using NodePrepareResourcesResponse = drav1beta1::NodePrepareResourcesResponse;
  using NodeUnprepareResourcesRequest = drav1beta1::NodeUnprepareResourcesRequest;
  using NodeUnprepareResourcesResponse = drav1beta1::NodeUnprepareResourcesResponse;
};

}  // namespace

class DraServer::Services {
 public:
  class Registration final : public pluginregistration::Registration::Service {
   public:
    explicit Registration(DraServer* s) : s_(s) {}
    grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                         pluginregistration::PluginInfo* info) override {
      info->set_type("DRAPlugin");
      info->set_name(s_->options_.driver);
      info->set_endpoint(s_->service_socket());
      // Newest first: the kubelet takes the first it knows.
      info->add_supported_versions("v1.DRAPlugin");
      info->add_supported_versions("v1beta1.DRAPlugin");
      // Last: the kubelet takes its DRAPlugin service from the first ones.
      // Health in both versions: a 1.37 kubelet prefers v1 and opens the
      // stream only when one is listed; 1.34-1.36 know v1alpha1 only.
      info->add_supported_versions("v1.DRAResourceHealth");
      info->add_supported_versions("v1alpha1.DRAResourceHealth");
      return grpc::Status::OK;
    }
    grpc::Status NotifyRegistrationStatus(
        grpc::ServerContext*, const pluginregistration::RegistrationStatus* st,
        pluginregistration::RegistrationStatusResponse*) override {
      s_->registered_ = st->plugin_registered();
      if (st->plugin_registered()) {
        LOG(INFO) << "DRA driver " << s_->options_.driver << ": registered with the kubelet";
        if (s_->options_.on_registered) s_->options_.on_registered();
      } else {
        LOG(ERROR) << "DRA driver " << s_->options_.driver
                   << ": the kubelet refused the registration: " << st->error();
      }
      s_->events_->Emit("dra_registration", {{"driver", s_->options_.driver},
                                             {"registered", st->plugin_registered()},
                                             {"error", st->error()}});
      return grpc::Status::OK;
    }

   private:
    DraServer* const s_;
  };

  Services(DraServer* s, ClaimPreparer* p, EventLog* e) : v1(s, p, e), v1beta1(s, p, e), reg(s) {}
  DraService<ApiV1> v1;
  DraService<ApiV1Beta1> v1beta1;
  Registration reg;
  std::unique_ptr<GoStyleUnknownHandler> unknown_service, unknown_registration;
};

DraServer::DraServer(Options options, ClaimPreparer* preparer, EventLog* events)
    : options_(std::move(options)), preparer_(preparer), events_(events) {}

DraServer::~DraServer() { Stop(); }

std::string DraServer::registration_socket() const {
  return RegistrationSocketOf(options_.socket_generation);
}

std::string DraServer::service_socket() const {
  return ServiceSocketOf(options_.socket_generation);
}

std::string DraServer::RegistrationSocketOf(int g) const {
  return JoinPath(JoinPath(options_.kubelet_root, "plugins_registry"),
                  g == 0 ? absl::StrCat(options_.driver, "-reg.sock")
                         : absl::StrCat(options_.driver, "-reg-", g, ".sock"));
}

std::string DraServer::ServiceSocketOf(int g) const {
  return JoinPath(JoinPath(JoinPath(options_.kubelet_root, "plugins"), options_.driver),
                  g == 0 ? std::string("dra.sock") : absl::StrCat("dra-", g, ".sock"));
}

namespace {

// Where a hand-over renames a registration socket away: ".NAME.old" beside
// it (the plugin watcher ignores names starting with '.').
std::string RenamedAway(const std::string& reg) {
  return JoinPath(reg.substr(0, reg.rfind('/')),
                  absl::StrCat(".", reg.substr(reg.rfind('/') + 1), ".old"));
}

// Whether `path` is a Unix socket (not a link to one) that nobody listens on.
bool DeadSocket(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && !SomeoneListens(path);
}

}  // namespace

void DraServer::RemoveDeadInstances() {
  const int other = options_.socket_generation == 0 ? 1 : 0;
  const std::string reg = RegistrationSocketOf(other);
  // The other generation's registration, and what a hand-over renamed away
  // (".NAME.old", which the plugin watcher ignores): left by a dpproxy that
  // was killed, or whose successor was. A live one (a predecessor handing
  // over) answers the connect and is left alone.
  for (const std::string& path : {reg, RenamedAway(reg), RenamedAway(registration_socket())}) {
    if (!DeadSocket(path)) continue;
    if (::unlink(path.c_str()) != 0) {
      LOG(WARNING) << "DRA driver " << options_.driver << ": cannot remove " << path
                   << ", a registration nobody serves (" << ErrnoText(errno) << ")";
      continue;
    }
    const bool watched = path == reg;
    LOG(WARNING) << "DRA driver " << options_.driver << ": removed " << path
                 << ", a registration of an earlier dpproxy that nobody serves"
                 << (watched ? " (the kubelet forgets that instance, and stops calling and "
                               "watching its dead endpoint)"
                             : "");
    events_->Emit("dra_dead_instance_removed",
                  {{"driver", options_.driver}, {"registration", path}});
  }
  const std::string service = ServiceSocketOf(other);
  if (DeadSocket(service)) ::unlink(service.c_str());
}

bool DraServer::SocketPresent() {
  struct stat st;
  return service_server_ != nullptr && ::stat(service_socket().c_str(), &st) == 0 &&
         S_ISSOCK(st.st_mode);
}

void DraServer::HoldCalls() { gate_.Hold(); }

bool DraServer::WaitForCallsServed(absl::Duration timeout) {
  return gate_.WaitForServed(timeout);
}

size_t DraServer::ForwardCalls(const std::string& socket) {
  const size_t held = gate_.Forward(socket);
  LOG(INFO) << "DRA driver " << options_.driver << ": the kubelet's calls go on to " << socket
            << " (" << held << " held)";
  return held;
}

void DraServer::ServeCalls() { gate_.Serve(); }

absl::Status DraServer::Start() {
  services_ = std::make_unique<Services>(this, preparer_, events_);
  for (const std::string& path : {service_socket(), registration_socket()}) {
    if (absl::Status s = ValidateSocketPath(path); !s.ok()) return s;
    if (absl::Status s = MakeDirs(path.substr(0, path.rfind('/'))); !s.ok()) return s;
    ::unlink(path.c_str());  // a previous run's socket
  }
  // Before this instance's registration exists: up to 1.32 the deletion of
  // any registration socket of the driver deregisters it by name.
  RemoveDeadInstances();
  // The service socket first: the kubelet dials it once it read GetInfo.
  {
    grpc::ServerBuilder b;
    b.AddListeningPort(UnixAddress(service_socket()), grpc::InsecureServerCredentials());
    b.RegisterService(&services_->v1);
    b.RegisterService(&services_->v1beta1);
    for (grpc::Service* health : health_.services()) b.RegisterService(health);
    services_->unknown_service = std::make_unique<GoStyleUnknownHandler>(
        std::vector<std::string>{"k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
                                 "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
                                 "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"});
    b.RegisterCallbackGenericService(services_->unknown_service.get());
    service_server_ = b.BuildAndStart();
  }
  if (service_server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve ", service_socket()));
  }
  {
    grpc::ServerBuilder b;
    b.AddListeningPort(UnixAddress(registration_socket()), grpc::InsecureServerCredentials());
    b.RegisterService(&services_->reg);
    services_->unknown_registration = std::make_unique<GoStyleUnknownHandler>(
        std::vector<std::string>{"pluginregistration.Registration"});
    b.RegisterCallbackGenericService(services_->unknown_registration.get());
    registration_server_ = b.BuildAndStart();
  }
  if (registration_server_ == nullptr) {
    service_server_->Shutdown();
    return absl::UnavailableError(absl::StrCat("cannot serve ", registration_socket()));
  }
  LOG(INFO) << "DRA driver " << options_.driver << ": registration at " << registration_socket()
            << ", service at " << service_socket();
  events_->Emit("dra_serving", {{"driver", options_.driver},
                                {"registration", registration_socket()},
                                {"service", service_socket()}});
  return absl::OkStatus();
}

void DraServer::Stop(bool handed_over, Withdrawal how) {
  if (!gate_.Stop()) return;  // the first one says how (the destructor's does not)
  health_.Stop();  // the streams end, or Shutdown would wait for them
  const std::string reg = registration_socket();
  const std::string away = RenamedAway(reg);
  const bool rename_away = handed_over && how == Withdrawal::kRename;
  if (registration_server_ != nullptr) {
    // The registration socket goes first, while the service still answers:
    // the kubelet's watcher acts on its deletion and forgets this instance
    // before its endpoint goes. gRPC deletes a socket file when its server
    // stops: a renamed one is out of its way.
    if (rename_away && ::rename(reg.c_str(), away.c_str()) != 0) {
      LOG(WARNING) << "DRA driver " << options_.driver << ": cannot rename " << reg << " away ("
                   << ErrnoText(errno) << "); a 1.32 kubelet deregisters the driver when it goes";
    } else if (!rename_away) {
      ::unlink(reg.c_str());
    }
    if (handed_over) {
      LOG(INFO) << "DRA driver " << options_.driver << ": this instance's registration "
                << (rename_away ? "renamed away (the kubelet replaced it with the successor's)"
                                : "deleted (the kubelet forgets this instance, and keeps the "
                                  "successor's)");
      events_->Emit("dra_instance_withdrawn", {{"driver", options_.driver},
                                               {"registration", reg},
                                               {"by", rename_away ? "rename" : "deletion"}});
    }
  }
  for (std::unique_ptr<grpc::Server>* s : {&registration_server_, &service_server_}) {
    if (*s == nullptr) continue;
    (*s)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    (*s)->Wait();
    s->reset();
  }
  ::unlink(rename_away ? away.c_str() : reg.c_str());
  ::unlink(service_socket().c_str());
}

}  // namespace dpproxy
