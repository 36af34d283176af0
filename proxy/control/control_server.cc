#include "proxy/control/control_server.h"

#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "proxy/rpc/grpc_status.h"

namespace dpproxy {
namespace {

namespace pb = ::dpproxy::control::v1;

// A reason is one line of text: valid UTF-8 with no control character (C0,
// DEL, C1), so logs, events and status show it as given.
absl::Status CheckText(const char* field, const std::string& value, size_t max) {
  if (value.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", field, " is ", value.size(), " bytes, more than ", max));
  }
  for (size_t i = 0; i < value.size();) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > value.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ", field, " is not UTF-8 (at byte ", i, ")"));
    }
    uint32_t cp = len == 1 ? c : c & (0x7f >> len);
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(value[i + k]);
      if ((cc >> 6) != 0x2) {
        return absl::InvalidArgumentError(
            absl::StrCat("the ", field, " is not UTF-8 (at byte ", i, ")"));
      }
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp < 0xa0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", field, " has a control character (", absl::StrFormat("U+%04X", cp),
          " at byte ", i, "); give it as one line of text"));
    }
    i += len;
  }
  return absl::OkStatus();
}

absl::Status CheckNames(const std::string& resource, const std::string& device) {
  if (resource.empty()) return absl::InvalidArgumentError("no resource named");
  if (device.empty()) return absl::InvalidArgumentError("no device named");
  if (absl::Status s = CheckText("resource name", resource, kMaxCordonNameBytes); !s.ok()) {
    return s;
  }
  return CheckText("device ID", device, kMaxCordonNameBytes);
}

pb::CordonEntry EntryOf(const Cordon& c) {
  pb::CordonEntry e;
  e.set_resource(c.resource);
  e.set_device(c.device);
  e.set_reason(c.reason);
  e.set_since_unix_ms(absl::ToUnixMillis(c.since));
  e.set_by_uid(c.by_uid);
  e.set_by_pid(c.by_pid);
  return e;
}

}  // namespace

absl::Status CheckCordonReason(const std::string& reason) {
  return CheckText("reason", reason, kMaxCordonReasonBytes);
}

class ControlServer::Service final : public pb::Control::CallbackService {
 public:
  explicit Service(Host* host) : host_(host) {}
  void SetSocket(OwnerOnlySocket* socket) { socket_ = socket; }

  grpc::ServerUnaryReactor* Cordon(grpc::CallbackServerContext* ctx,
                                   const pb::CordonRequest* req, pb::CordonReply* reply) override {
    absl::Status s = CheckNames(req->resource(), req->device());
    if (s.ok()) s = CheckCordonReason(req->reason());
    if (s.ok()) {
      const OwnerOnlySocket::Peer by = Caller(ctx);
      absl::StatusOr<dpproxy::Cordon> c = host_->CordonDevice(
          dpproxy::Cordon{req->resource(), req->device(), req->reason(), absl::Now(), by.uid,
                          by.pid});
      if (c.ok()) *reply->mutable_cordon() = EntryOf(*c);
      s = c.status();
    }
    return Finish(ctx, s);
  }

  grpc::ServerUnaryReactor* Uncordon(grpc::CallbackServerContext* ctx,
                                     const pb::UncordonRequest* req,
                                     pb::CordonReply* reply) override {
    absl::Status s = CheckNames(req->resource(), req->device());
    if (s.ok()) {
      absl::StatusOr<dpproxy::Cordon> c =
          host_->UncordonDevice(req->resource(), req->device(), Caller(ctx));
      if (c.ok()) *reply->mutable_cordon() = EntryOf(*c);
      s = c.status();
    }
    return Finish(ctx, s);
  }

  grpc::ServerUnaryReactor* ListCordons(grpc::CallbackServerContext* ctx,
                                        const pb::ListCordonsRequest*,
                                        pb::ListCordonsReply* reply) override {
    for (const dpproxy::Cordon& c : host_->Cordons()) *reply->add_cordons() = EntryOf(c);
    return Finish(ctx, absl::OkStatus());
  }

 private:
  OwnerOnlySocket::Peer Caller(grpc::CallbackServerContext* ctx) {
    std::optional<OwnerOnlySocket::Peer> p = socket_->PeerOf(ctx->peer());
    return p.value_or(OwnerOnlySocket::Peer{});
  }
  static grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx,
                                          const absl::Status& s) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(ToGrpcStatus(s));
    return r;
  }

  Host* const host_;
  OwnerOnlySocket* socket_ = nullptr;
};

absl::StatusOr<std::unique_ptr<ControlServer>> ControlServer::Start(
    const std::string& socket_path, Host* host) {
  std::unique_ptr<ControlServer> s(new ControlServer());
  s->service_ = std::make_unique<Service>(host);
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(64 << 10);  // a request is a few names and a reason
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve the control socket ", socket_path));
  }
  absl::StatusOr<std::unique_ptr<OwnerOnlySocket>> socket = OwnerOnlySocket::Listen(
      socket_path, s->server_.get(), "control socket", "change what dpproxy serves");
  if (!socket.ok()) return socket.status();
  s->socket_ = *std::move(socket);
  s->service_->SetSocket(s->socket_.get());
  return s;
}

ControlServer::~ControlServer() {
  socket_.reset();  // no new connection; the socket goes
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
  }
}

}  // namespace dpproxy
