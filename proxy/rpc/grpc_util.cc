#include "proxy/rpc/grpc_util.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <vector>

#include <grpc/grpc.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/util/files.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DPP_HAS_ASAN 1
#endif
#endif
#ifndef DPP_HAS_ASAN
#define DPP_HAS_ASAN 0
#endif
#if defined(__SANITIZE_ADDRESS__) || DPP_HAS_ASAN
#include <sanitizer/lsan_interface.h>
#endif

namespace dpproxy {

void KeepGrpcForProcess() {
  static std::once_flag once;
  std::call_once(once, [] {
    grpc_init();
    // gRPC 1.51's callback API, without a background poller, runs every
    // callback server's and channel's completions on one shared queue and
    // its "nexting" threads, torn down when its last user goes. When that
    // last user is let go inside a callback, on one of those very threads
    // (a stream's reactor dropping the last reference to its channel as
    // dpproxy stops, everything else stopped already), the queue is
    // destroyed under the thread, which then unrefs it: `assertion failed:
    // prior > 0` in ref_counted.h and an abort (seen on SIGTERM after a
    // large list, and after a handover with --after_handoff=wait). A
    // server with a callback service, started here and kept for the
    // process's life (reachable from these statics), holds the queue from
    // the start, so its last user is never one of the others.
    static grpc::CallbackGenericService* const service = new grpc::CallbackGenericService();
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(service);
    static grpc::Server* const anchor = builder.BuildAndStart().release();
    (void)anchor;
  });
}

void EndProcess(int code) {
  std::fflush(nullptr);
#if defined(__SANITIZE_ADDRESS__) || DPP_HAS_ASAN
  __lsan_do_leak_check();
#endif
  std::_Exit(code);
}

grpc::ServerGenericBidiReactor* GoStyleUnknownHandler::CreateReactor(
    grpc::GenericCallbackServerContext* ctx) {
  // "/pkg.Service/Method"
  std::string method = ctx->method();
  std::string service, name;
  size_t slash = method.find('/', 1);
  if (!method.empty() && method[0] == '/' && slash != std::string::npos) {
    service = method.substr(1, slash - 1);
    name = method.substr(slash + 1);
  } else {
    service = method;
  }
  std::string message;
  if (std::find(served_.begin(), served_.end(), service) != served_.end()) {
    message = absl::StrCat("unknown method ", name, " for service ", service);
  } else {
    message = absl::StrCat("unknown service ", service);
  }
  if (on_call_) on_call_(method, message);
  class Reactor : public grpc::ServerGenericBidiReactor {
   public:
    explicit Reactor(std::string message) {
      Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, message));
    }
    void OnDone() override { delete this; }
  };
  return new Reactor(std::move(message));
}

std::shared_ptr<grpc::Channel> MakeUnixChannel(const std::string& socket_path,
                                               int max_receive_bytes,
                                               absl::Duration first_retry) {
  grpc::ChannelArguments args;
  if (max_receive_bytes > 0) args.SetMaxReceiveMessageSize(max_receive_bytes);
  // Peers on a Unix socket come back quickly after a restart; do not wait
  // seconds between reconnection attempts. GRPC_ARG_MIN_RECONNECT_BACKOFF_MS
  // is deliberately left alone: gRPC also uses it as the minimum connect
  // timeout, and at 100 ms a busy peer's handshake times out again and again
  // (measured: up to 5 s of unavailability after a restart).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(first_retry))));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Separate channels to the same socket must not share a subchannel, so a
  // dead peer's connection is not reused by a fresh channel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(UnixAddress(socket_path),
                                   grpc::InsecureChannelCredentials(), args);
}

namespace {

std::unique_ptr<grpc::Server> BuildOn(grpc::ServerBuilder& builder, const std::string& socket) {
  builder.AddListeningPort(UnixAddress(socket), grpc::InsecureServerCredentials());
  return builder.BuildAndStart();
}

void StopNow(grpc::Server& server) {
  server.Shutdown(std::chrono::system_clock::now());
  server.Wait();
}

constexpr char kStagingPrefix[] = ".dpproxy-";

// Removes what a dpproxy killed inside StartServerAt left in `dir`: a
// private directory of ours a minute old or more, holding nothing or a
// socket nobody listens on. One in use (another dpproxy's, a moment old)
// is left alone, and so is anything else.
void RemoveStaleStaging(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> stale;
  const time_t old = ::time(nullptr) - 60;
  while (struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(kStagingPrefix, 0) != 0 || name.size() != sizeof(kStagingPrefix) - 1 + 6) {
      continue;
    }
    struct stat st;
    const std::string path = JoinPath(dir, name);
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
        st.st_mtime > old) {
      continue;
    }
    stale.push_back(path);
  }
  ::closedir(d);
  for (const std::string& path : stale) {
    const std::string socket = JoinPath(path, "s");
    struct stat st;
    if (::lstat(socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && !SomeoneListens(socket)) {
      ::unlink(socket.c_str());
    }
    ::rmdir(path.c_str());  // only if empty now
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<grpc::Server>> StartServerAt(grpc::ServerBuilder& builder,
                                                            const std::string& path, mode_t mode,
                                                            gid_t gid) {
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && !S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists and is not a socket; not replacing it"));
  }
  std::string staging = JoinPath(DirName(path), absl::StrCat(kStagingPrefix, "XXXXXX"));
  if (!ValidateSocketPath(JoinPath(staging, "s")).ok()) {
    // No room for the private directory in a socket's path.
    std::unique_ptr<grpc::Server> server = BuildOn(builder, path);
    if (server == nullptr) return absl::UnavailableError(absl::StrCat("cannot listen on ", path));
    if (absl::Status m = SetMode(path, mode, gid); !m.ok()) {
      StopNow(*server);
      return m;
    }
    return server;
  }
  RemoveStaleStaging(DirName(path));
  if (::mkdtemp(staging.data()) == nullptr) {
    return ErrnoStatus(errno, absl::StrCat("create a directory beside ", path));
  }
  const std::string socket = JoinPath(staging, "s");
  std::unique_ptr<grpc::Server> server = BuildOn(builder, socket);
  absl::Status s;
  if (server == nullptr) {
    s = absl::UnavailableError(absl::StrCat("cannot listen on ", path));
  } else if (s = SetMode(socket, mode, gid); s.ok() && ::rename(socket.c_str(), path.c_str()) != 0) {
    s = ErrnoStatus(errno, absl::StrCat("rename ", socket, " to ", path));
  }
  if (!s.ok() && server != nullptr) StopNow(*server);
  ::unlink(socket.c_str());  // there only if something failed
  ::rmdir(staging.c_str());
  if (!s.ok()) return s;
  return server;
}

absl::Status WaitForConnected(grpc::Channel* channel, absl::Duration timeout) {
  // gRPC's own wait: connects and follows state changes until READY.
  if (channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError("context deadline exceeded");
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> DialUnixChannel(
    const std::string& socket_path, absl::Duration timeout,
    const std::function<bool()>& cancelled) {
  const absl::Time connect_by = absl::Now() + timeout;
  std::shared_ptr<grpc::Channel> channel;
  for (absl::Duration slice = absl::Milliseconds(5);;
       slice = std::min(slice * 2, absl::Milliseconds(200))) {
    if (cancelled && cancelled()) return absl::CancelledError("cancelled");
    const absl::Duration left = connect_by - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("context deadline exceeded");
    }
    const absl::Duration step = std::min(slice, left);
    if (channel == nullptr) {
      if (!SomeoneListens(socket_path)) {
        absl::SleepFor(step);
        continue;
      }
      channel = MakeUnixChannel(socket_path, 0, absl::Milliseconds(5));
    }
    if (WaitForConnected(channel.get(), step).ok()) return channel;
    // Refused (the peer went between the look and the connect): the channel
    // would wait for its reconnect timer, so the next look makes a fresh
    // one. A channel still connecting is kept.
    if (channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) channel.reset();
  }
}

std::string GoCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "Canceled";
    case grpc::StatusCode::UNKNOWN: return "Unknown";
    case grpc::StatusCode::INVALID_ARGUMENT: return "InvalidArgument";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DeadlineExceeded";
    case grpc::StatusCode::NOT_FOUND: return "NotFound";
    case grpc::StatusCode::ALREADY_EXISTS: return "AlreadyExists";
    case grpc::StatusCode::PERMISSION_DENIED: return "PermissionDenied";
    case grpc::StatusCode::UNAUTHENTICATED: return "Unauthenticated";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "ResourceExhausted";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FailedPrecondition";
    case grpc::StatusCode::ABORTED: return "Aborted";
    case grpc::StatusCode::OUT_OF_RANGE: return "OutOfRange";
    case grpc::StatusCode::UNIMPLEMENTED: return "Unimplemented";
    case grpc::StatusCode::INTERNAL: return "Internal";
    case grpc::StatusCode::UNAVAILABLE: return "Unavailable";
    case grpc::StatusCode::DATA_LOSS: return "DataLoss";
    default: return absl::StrCat("Code(", static_cast<int>(code), ")");
  }
}

std::string GoRpcError(const grpc::Status& s) {
  return absl::StrCat("rpc error: code = ", GoCodeName(s.error_code()),
                      " desc = ", s.error_message());
}

}  // namespace dpproxy
