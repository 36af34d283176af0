#include "proxy/handoff/handoff.h"

#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/server_builder.h>
#include <glog/logging.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/rpc/owner_only_socket.h"
#include "proxy/util/files.h"
#include "proxy/util/job_threads.h"
#include "proxy/util/thread_name.h"
#include "proxy/version/version.h"

namespace dpproxy {

namespace {

// What the handoff socket accepts: a takeover's calls in order, each once
// (Release, Forward, Finish), from a process that exists, with bounded
// fields. Anything else is refused with the reason and changes nothing.
constexpr size_t kMaxVersionBytes = 64;
constexpr size_t kMaxForwardSockets = 4096;
constexpr size_t kMaxReasonBytes = 1024;
constexpr int kMaxMessageBytes = 1 << 20;

// A text field a caller sends: printable ASCII, at most `max` bytes.
absl::Status CheckText(const char* call, const char* field, const std::string& value,
                       size_t max) {
  if (value.size() > max) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": the ", field, " is ", value.size(),
                                                   " bytes, more than ", max));
  }
  for (unsigned char c : value) {
    if (c < 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(call, ": the ", field, " is not printable ASCII"));
    }
  }
  return absl::OkStatus();
}

// The real user ID of process `pid` (/proc/PID/status), or nullopt.
std::optional<uid_t> UidOf(int64_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    unsigned long uid = 0;
    if (std::sscanf(line.c_str(), "Uid: %lu", &uid) == 1) return static_cast<uid_t>(uid);
  }
  return std::nullopt;
}

// The pid process `pid` (of this PID namespace) has in its own, innermost
// PID namespace (/proc/PID/status, NSpid), or nullopt.
std::optional<int64_t> InnermostPidOf(int64_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "NSpid:")) continue;
    std::vector<absl::string_view> pids =
        absl::StrSplit(rest, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    int64_t innermost = 0;
    if (pids.empty() || !absl::SimpleAtoi(pids.back(), &innermost)) return std::nullopt;
    return innermost;
  }
  return std::nullopt;
}

// The process a Release from a connection of `connected` (the kernel's
// pid of the caller here: 0 if this namespace cannot see it; nullopt if not
// known) naming `named` hands the state to, numbered here: the caller
// itself when it named itself from a PID namespace of its own (a pod's),
// 0 when that namespace is hidden from this one; else the process named.
int64_t ReleasedTo(int64_t named, std::optional<int64_t> connected) {
  if (!connected.has_value() || *connected == named) return named;
  if (*connected == 0) return 0;
  return InnermostPidOf(*connected) == named ? *connected : named;
}

// `here`: the process released to, numbered here (ReleasedTo; 0: in a
// namespace this one cannot see, whose connection passed the user check).
absl::Status CheckRelease(const handoff::v1::ReleaseRequest& req, int64_t here) {
  if (req.pid() <= 0 || req.pid() > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("Release: pid ", req.pid(), " is not a process ID"));
  }
  if (here > 0) {
    if (::kill(static_cast<pid_t>(here), 0) != 0 && errno == ESRCH) {
      return absl::InvalidArgumentError(
          absl::StrCat("Release: pid ", here, " is not a running process"));
    }
    // The state goes to a process of this dpproxy's own user, never
    // another's (one this namespace cannot see passed the same check on
    // its connection).
    const std::optional<uid_t> uid = UidOf(here);
    if (!uid.has_value() || *uid != ::geteuid()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "Release: pid ", here,
          uid.has_value() ? absl::StrCat(" runs as uid ", *uid)
                          : std::string(" has no readable uid"),
          ", not as this dpproxy's user (uid ", ::geteuid(), ")"));
    }
  }
  return CheckText("Release", "version", req.version(), kMaxVersionBytes);
}

absl::Status CheckForward(const handoff::v1::ForwardRequest& req) {
  if (req.sockets().empty() || req.sockets_size() > static_cast<int>(kMaxForwardSockets)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Forward: ", req.sockets_size(), " sockets (1 to ", kMaxForwardSockets, " expected)"));
  }
  for (const auto& [resource, socket] : req.sockets()) {
    if (socket.empty() || socket.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("Forward: the socket for ", GoQuote(resource), " is not an absolute path"));
    }
    if (absl::Status s = ValidateSocketPath(socket); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("Forward: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckHandBack(const handoff::v1::HandBackRequest& req) {
  return CheckText("HandBack", "reason", req.reason(), kMaxReasonBytes);
}

}  // namespace

// Served with gRPC's callback API: a synchronous service would keep a
// thread of its own polling gRPC's completion queues for the whole life of
// the process, waking for other servers' work too (measured: about a tenth
// of dpproxy's CPU per Allocate with a journal). A call's work may block
// for seconds (a release waits for the Allocates in progress), so it runs
// on a thread of its own, never on gRPC's.
class HandoffServer::Service final : public handoff::v1::Handoff::CallbackService {
 public:
  Service(Hooks hooks) : hooks_(std::move(hooks)) {}
  // The socket whose callers it serves (set once, before the first call).
  void SetSocket(OwnerOnlySocket* socket) { socket_ = socket; }
  ~Service() override { JoinWorkers(); }

  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const handoff::v1::ReleaseRequest* req,
                                    handoff::v1::ReleaseReply* reply) override {
    std::optional<int64_t> here;
    if (std::optional<OwnerOnlySocket::Peer> peer = socket_->PeerOf(ctx->peer())) {
      here = peer->pid;
    }
    return Run(ctx, [this, req, reply, here] { return DoRelease(req, here, reply); });
  }
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* ctx,
                                    const handoff::v1::ForwardRequest* req,
                                    handoff::v1::ForwardReply* reply) override {
    return Run(ctx, [this, req, reply] { return DoForward(req, reply); });
  }
  grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx,
                                   const handoff::v1::FinishRequest*,
                                   handoff::v1::FinishReply*) override {
    return Run(ctx, [this] { return DoFinish(); });
  }
  grpc::ServerUnaryReactor* HandBack(grpc::CallbackServerContext* ctx,
                                     const handoff::v1::HandBackRequest* req,
                                     handoff::v1::HandBackReply*) override {
    return Run(ctx, [this, req] { return DoHandBack(req); });
  }

  // Waits for every call's work to end (after the server stopped taking
  // calls).
  void JoinWorkers() { workers_.JoinAll(); }

 private:
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx,
                                std::function<grpc::Status()> work) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    workers_.Spawn([reactor, work = std::move(work)] { reactor->Finish(work()); });
    return reactor;
  }

  // `seen`: the caller's pid here, as the kernel gave it (ReleasedTo).
  grpc::Status DoRelease(const handoff::v1::ReleaseRequest* req, std::optional<int64_t> seen,
                         handoff::v1::ReleaseReply* reply) {
    const int64_t here = ReleasedTo(req->pid(), seen);
    if (absl::Status s = CheckRelease(*req, here); !s.ok()) return Refuse(s);
    {
      absl::MutexLock lock(&mu_);
      if (stage_ != Stage::kServing) {
        return Refuse(absl::FailedPreconditionError(absl::StrCat(
            "Release: the state was released already, to pid ", peer_)));
      }
      stage_ = Stage::kReleasing;  // one Release at a time
    }
    LOG(INFO) << "handoff: dpproxy " << req->version() << " (pid " << req->pid()
              << (here == req->pid() ? std::string()
                  : here > 0         ? absl::StrCat(" in its PID namespace, ", here, " here")
                                     : std::string(" in a PID namespace this one cannot see"))
              << ") asks to take the state directory over";
    absl::StatusOr<int> generation = hooks_.release(here);
    {
      absl::MutexLock lock(&mu_);
      stage_ = generation.ok() ? Stage::kReleased : Stage::kServing;
      if (generation.ok()) peer_ = req->pid();
    }
    if (!generation.ok()) return ToGrpcStatus(generation.status());
    reply->set_socket_generation(*generation);
    reply->set_pid(::getpid());
    reply->set_version(std::string(kDpproxyVersion));
    return grpc::Status::OK;
  }

  grpc::Status DoForward(const handoff::v1::ForwardRequest* req,
                         handoff::v1::ForwardReply* reply) {
    if (absl::Status s = CheckForward(*req); !s.ok()) return Refuse(s);
    {
      absl::MutexLock lock(&mu_);
      if (stage_ != Stage::kReleased) {
        return Refuse(absl::FailedPreconditionError(
            stage_ == Stage::kForwarding || stage_ == Stage::kFinished
                ? "Forward: the Allocates are forwarded already"
                : "Forward before Release: nothing has taken the state over"));
      }
      stage_ = Stage::kForwarding;
    }
    std::map<std::string, std::string> sockets(req->sockets().begin(), req->sockets().end());
    absl::StatusOr<int64_t> held = hooks_.forward(sockets);
    if (!held.ok()) {
      absl::MutexLock lock(&mu_);
      stage_ = Stage::kReleased;
      return ToGrpcStatus(held.status());
    }
    reply->set_held(*held);
    return grpc::Status::OK;
  }

  grpc::Status DoFinish() {
    {
      absl::MutexLock lock(&mu_);
      if (stage_ != Stage::kForwarding) {
        return Refuse(absl::FailedPreconditionError(
            stage_ == Stage::kFinished
                ? "Finish: finishing already"
                : "Finish before Release and Forward: nothing has taken over; this dpproxy "
                  "goes on serving"));
      }
      stage_ = Stage::kFinished;
    }
    hooks_.finish();
    return grpc::Status::OK;
  }

  grpc::Status DoHandBack(const handoff::v1::HandBackRequest* req) {
    if (absl::Status s = CheckHandBack(*req); !s.ok()) return Refuse(s);
    Stage was;
    {
      absl::MutexLock lock(&mu_);
      if (stage_ != Stage::kReleased && stage_ != Stage::kForwarding) {
        return Refuse(absl::FailedPreconditionError(
            stage_ == Stage::kFinished
                ? "HandBack after Finish: this dpproxy is stopping"
                : "HandBack before Release: nothing was handed over"));
      }
      if (req->pid() != peer_) {
        return Refuse(absl::PermissionDeniedError(
            absl::StrCat("HandBack from pid ", req->pid(), ": the state was released to pid ",
                         peer_)));
      }
      was = stage_;
      stage_ = Stage::kReleasing;  // nothing else meanwhile
    }
    LOG(INFO) << "handoff: dpproxy pid " << req->pid() << " hands the state back: "
              << req->reason();
    absl::Status s = hooks_.hand_back(req->reason());
    {
      absl::MutexLock lock(&mu_);
      stage_ = s.ok() ? Stage::kServing : was;
      if (s.ok()) peer_ = 0;
    }
    return ToGrpcStatus(s);
  }

 public:
  void Reopen() {
    absl::MutexLock lock(&mu_);
    if (stage_ == Stage::kFinished) return;
    stage_ = Stage::kServing;
    peer_ = 0;
  }

 private:
  grpc::Status Refuse(const absl::Status& s) {
    LOG(WARNING) << "handoff: refused: " << s.message();
    return ToGrpcStatus(s);
  }

  enum class Stage { kServing, kReleasing, kReleased, kForwarding, kFinished };
  const Hooks hooks_;
  OwnerOnlySocket* socket_ = nullptr;
  JobThreads workers_;  // each call's work, joined as later calls come
  absl::Mutex mu_;
  Stage stage_ ABSL_GUARDED_BY(mu_) = Stage::kServing;
  int64_t peer_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::StatusOr<std::unique_ptr<HandoffServer>> HandoffServer::Start(const std::string& socket,
                                                                    Hooks hooks) {
  std::unique_ptr<HandoffServer> s(new HandoffServer());
  s->socket_ = socket;
  s->service_ = std::make_unique<Service>(std::move(hooks));
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve the handoff socket ", socket));
  }
  absl::StatusOr<std::unique_ptr<OwnerOnlySocket>> acceptor =
      OwnerOnlySocket::Listen(socket, s->server_.get(), "handoff socket", "take over");
  if (!acceptor.ok()) return acceptor.status();
  s->acceptor_ = *std::move(acceptor);
  s->service_->SetSocket(s->acceptor_.get());
  return s;
}

HandoffServer::~HandoffServer() { Stop(); }

void HandoffServer::Reopen() { service_->Reopen(); }

void HandoffServer::Stop() {
  acceptor_.reset();  // no new connection; the socket goes
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  // The calls in progress end when their work does.
  service_->JoinWorkers();
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

absl::Status HandoffClient::HandBack(const std::string& reason, absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  handoff::v1::HandBackRequest req;
  req.set_pid(::getpid());
  // Bounded and printable, as the old one accepts it.
  std::string text = reason.substr(0, kMaxReasonBytes);
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  req.set_reason(text);
  handoff::v1::HandBackReply reply;
  grpc::Status s = stub_->HandBack(&ctx, req, &reply);
  if (!s.ok()) return CallError("HandBack", socket_, s);
  return absl::OkStatus();
}

}  // namespace dpproxy
