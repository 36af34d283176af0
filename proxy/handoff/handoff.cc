#include "proxy/handoff/handoff.h"

#include <unistd.h>

#include <grpcpp/client_context.h>
#include <grpcpp/server_builder.h>
#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"
#include "proxy/version.h"

namespace dpproxy {

class HandoffServer::Service final : public handoff::v1::Handoff::Service {
 public:
  explicit Service(Hooks hooks) : hooks_(std::move(hooks)) {}

  grpc::Status Release(grpc::ServerContext*, const handoff::v1::ReleaseRequest* req,
                       handoff::v1::ReleaseReply* reply) override {
    LOG(INFO) << "handoff: dpproxy " << req->version() << " (pid " << req->pid()
              << ") asks to take the state directory over";
    absl::StatusOr<int> generation = hooks_.release(req->pid());
    if (!generation.ok()) return ToGrpcStatus(generation.status());
    reply->set_socket_generation(*generation);
    reply->set_pid(::getpid());
    reply->set_version(std::string(kDpproxyVersion));
    return grpc::Status::OK;
  }

  grpc::Status Forward(grpc::ServerContext*, const handoff::v1::ForwardRequest* req,
                       handoff::v1::ForwardReply* reply) override {
    std::map<std::string, std::string> sockets(req->sockets().begin(), req->sockets().end());
    absl::StatusOr<int64_t> held = hooks_.forward(sockets);
    if (!held.ok()) return ToGrpcStatus(held.status());
    reply->set_held(*held);
    return grpc::Status::OK;
  }

  grpc::Status Finish(grpc::ServerContext*, const handoff::v1::FinishRequest*,
                      handoff::v1::FinishReply*) override {
    hooks_.finish();
    return grpc::Status::OK;
  }

 private:
  const Hooks hooks_;
};

absl::StatusOr<std::unique_ptr<HandoffServer>> HandoffServer::Start(const std::string& socket,
                                                                    Hooks hooks) {
  std::unique_ptr<HandoffServer> s(new HandoffServer());
  s->socket_ = socket;
  s->service_ = std::make_unique<Service>(std::move(hooks));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(UnixAddress(socket), grpc::InsecureServerCredentials());
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve the handoff socket ", socket));
  }
  if (absl::Status m = SetMode(socket, 0600); !m.ok()) return m;
  return s;
}

HandoffServer::~HandoffServer() { Stop(); }

void HandoffServer::Stop() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
  server_.reset();
}

HandoffClient::HandoffClient(const std::string& socket)
    : socket_(socket), stub_(handoff::v1::Handoff::NewStub(MakeUnixChannel(socket))) {}

namespace {

absl::Status CallError(const char* step, const std::string& socket, const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("handoff ", step, " on ", socket, ": ", s.error_message()));
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

absl::StatusOr<HandoffClient::Released> HandoffClient::Release(absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  handoff::v1::ReleaseRequest req;
  req.set_pid(::getpid());
  req.set_version(std::string(kDpproxyVersion));
  handoff::v1::ReleaseReply reply;
  grpc::Status s = stub_->Release(&ctx, req, &reply);
  if (!s.ok()) return CallError("Release", socket_, s);
  return Released{reply.socket_generation(), reply.pid(), reply.version()};
}

absl::StatusOr<int64_t> HandoffClient::Forward(const std::map<std::string, std::string>& sockets,
                                               absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  handoff::v1::ForwardRequest req;
  req.mutable_sockets()->insert(sockets.begin(), sockets.end());
  handoff::v1::ForwardReply reply;
  grpc::Status s = stub_->Forward(&ctx, req, &reply);
  if (!s.ok()) return CallError("Forward", socket_, s);
  return reply.held();
}

absl::Status HandoffClient::Finish(absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  handoff::v1::FinishReply reply;
  grpc::Status s = stub_->Finish(&ctx, handoff::v1::FinishRequest(), &reply);
  if (!s.ok()) return CallError("Finish", socket_, s);
  return absl::OkStatus();
}

}  // namespace dpproxy
