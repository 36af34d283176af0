#include "proxy/kubelet_side/dra/dra_server.h"

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

}  // namespace

class DraServer::Services {
 public:
  class V1 final : public drav1::DRAPlugin::Service {
   public:
    V1(ClaimPreparer* p, EventLog* e) : p_(p), e_(e) {}
    grpc::Status NodePrepareResources(grpc::ServerContext* ctx,
                                      const drav1::NodePrepareResourcesRequest* req,
                                      drav1::NodePrepareResourcesResponse* resp) override {
      PrepareAll(p_, e_, ctx, *req, resp);
      return grpc::Status::OK;
    }
    grpc::Status NodeUnprepareResources(grpc::ServerContext*,
                                        const drav1::NodeUnprepareResourcesRequest* req,
                                        drav1::NodeUnprepareResourcesResponse* resp) override {
      UnprepareAll(p_, e_, *req, resp);
      return grpc::Status::OK;
    }

   private:
    ClaimPreparer* const p_;
    EventLog* const e_;
  };
  class V1Beta1 final : public drav1beta1::DRAPlugin::Service {
   public:
    V1Beta1(ClaimPreparer* p, EventLog* e) : p_(p), e_(e) {}
    grpc::Status NodePrepareResources(grpc::ServerContext* ctx,
                                      const drav1beta1::NodePrepareResourcesRequest* req,
                                      drav1beta1::NodePrepareResourcesResponse* resp) override {
      PrepareAll(p_, e_, ctx, *req, resp);
      return grpc::Status::OK;
    }
    grpc::Status NodeUnprepareResources(grpc::ServerContext*,
                                        const drav1beta1::NodeUnprepareResourcesRequest* req,
                                        drav1beta1::NodeUnprepareResourcesResponse* resp) override {
      UnprepareAll(p_, e_, *req, resp);
      return grpc::Status::OK;
    }

   private:
    ClaimPreparer* const p_;
    EventLog* const e_;
  };
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
      info->add_supported_versions("v1alpha1.DRAResourceHealth");
      return grpc::Status::OK;
    }
    grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                          const pluginregistration::RegistrationStatus* st,
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

  Services(DraServer* s, ClaimPreparer* p, EventLog* e) : v1(p, e), v1beta1(p, e), reg(s) {}
  V1 v1;
  V1Beta1 v1beta1;
  Registration reg;
  std::unique_ptr<GoStyleUnknownHandler> unknown_service, unknown_registration;
};

DraServer::DraServer(Options options, ClaimPreparer* preparer, EventLog* events)
    : options_(std::move(options)), preparer_(preparer), events_(events) {}

DraServer::~DraServer() { Stop(); }

std::string DraServer::registration_socket() const {
  return JoinPath(JoinPath(options_.kubelet_root, "plugins_registry"),
                  absl::StrCat(options_.driver, "-reg.sock"));
}

std::string DraServer::service_socket() const {
  return JoinPath(JoinPath(JoinPath(options_.kubelet_root, "plugins"), options_.driver),
                  "dra.sock");
}

absl::Status DraServer::Start() {
  services_ = std::make_unique<Services>(this, preparer_, events_);
  for (const std::string& path : {service_socket(), registration_socket()}) {
    if (absl::Status s = ValidateSocketPath(path); !s.ok()) return s;
    if (absl::Status s = MakeDirs(path.substr(0, path.rfind('/'))); !s.ok()) return s;
    ::unlink(path.c_str());  // a previous run's socket
  }
  // The service socket first: the kubelet dials it once it read GetInfo.
  {
    grpc::ServerBuilder b;
    b.AddListeningPort(UnixAddress(service_socket()), grpc::InsecureServerCredentials());
    b.RegisterService(&services_->v1);
    b.RegisterService(&services_->v1beta1);
    b.RegisterService(health_.service());
    services_->unknown_service = std::make_unique<GoStyleUnknownHandler>(
        std::vector<std::string>{"k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
                                 "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
                                 "v1alpha1.DRAResourceHealth"});
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

void DraServer::Stop() {
  health_.Stop();  // the streams end, or Shutdown would wait for them
  // The registration socket first: the kubelet's watcher sees it go and
  // deregisters the driver before the service goes.
  for (std::unique_ptr<grpc::Server>* s : {&registration_server_, &service_server_}) {
    if (*s == nullptr) continue;
    (*s)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    (*s)->Wait();
    s->reset();
  }
  for (const std::string& path : {registration_socket(), service_socket()}) ::unlink(path.c_str());
}

}  // namespace dpproxy
