// File: grpc_util.h
//
// gRPC pieces shared by the simulator, the sample plugin and the proxy.
#ifndef DPPROXY_PROXY_RPC_GRPC_UTIL_H_
#define DPPROXY_PROXY_RPC_GRPC_UTIL_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <sys/types.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dpproxy {

// Answers calls to services a server does not have the way Go gRPC servers
// (the kubelet, most plugins) do: UNIMPLEMENTED with "unknown service
// <pkg.Service>", or "unknown method <M> for service <pkg.Service>" when the
// service exists. C++ gRPC would answer with an empty message.
class GoStyleUnknownHandler : public grpc::CallbackGenericService {
 public:
  // `served` are full service names, e.g. "v1beta1.Registration".
  // `on_call`, if set, hears of each such call: its method and the error
  // sent back (a simulator records what a peer tried).
  using OnCall = std::function<void(const std::string& method, const std::string& error)>;
  explicit GoStyleUnknownHandler(std::vector<std::string> served, OnCall on_call = nullptr)
      : served_(std::move(served)), on_call_(std::move(on_call)) {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* ctx) override;

 private:
  const std::vector<std::string> served_;
  const OnCall on_call_;
};

// Keeps gRPC initialized until the process ends; called once at the start
// of a binary's main. Otherwise destroying the last server or channel runs
// gRPC's global shutdown, which waits for its executor thread, and that
// thread may sit in a poll for about 10 s (a write the peer stopped
// reading, such as a list over the kubelet's 4 MiB): a stop that should
// take milliseconds takes seconds. gRPC's threads then live until the
// end: such a binary ends with EndProcess once it has stopped, so that no
// static destructor runs beside them. It also keeps gRPC's shared queue of
// callback completions alive for the process's life (grpc_util.cc says
// why). Once per process; later calls do nothing.
void KeepGrpcForProcess();

// Ends a process that called KeepGrpcForProcess, once it has stopped
// everything and written what it had to: flushes stdio, runs the leak
// check in a sanitizer build (exit would have run it), and _exits with
// `code`. Exit's static destructors would run beside gRPC's own threads,
// which are still at work on its global state (a double free seen on a
// busy machine).
[[noreturn]] void EndProcess(int code);

// A channel to a Unix socket, made once and reused for every call.
// `max_receive_bytes` > 0 raises (or lowers) gRPC's 4 MiB default limit on
// messages received over the channel. `first_retry` is how long gRPC waits
// before connecting again after the first refusal (then longer, up to 1 s).
std::shared_ptr<grpc::Channel> MakeUnixChannel(const std::string& socket_path,
                                               int max_receive_bytes = 0,
                                               absl::Duration first_retry =
                                                   absl::Milliseconds(100));

// Builds and starts `builder`'s server on the Unix socket `path`, which
// appears there once, with its `mode` (and group `gid`, unless -1) already
// set: it is bound in a private directory beside `path` (mode 0700), then
// renamed into place. Nobody can connect before the mode allows it, and a
// watcher of the directory sees one creation and no change after it (a
// plugin that tells one kubelet.sock from the next by inode and change
// time takes a later chmod for a new kubelet and registers twice). A path
// already there is replaced if it is a socket and refused otherwise. Where
// the private path would be too long for a socket, the socket is bound at
// `path` and its mode set after. Private directories a killed dpproxy left
// there (a minute old or more, holding no socket anyone listens on) are
// removed first.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartServerAt(grpc::ServerBuilder& builder,
                                                            const std::string& path, mode_t mode,
                                                            gid_t gid = static_cast<gid_t>(-1));

// Waits until `channel` is connected; kDeadlineExceeded after `timeout`.
absl::Status WaitForConnected(grpc::Channel* channel, absl::Duration timeout);

// A channel to a Unix socket, connected (MakeUnixChannel's settings).
// A socket bound a moment before its server listens refuses a connect,
// and a channel's next try then waits for gRPC's reconnect timer, which
// gRPC 1.51 was seen to fire ~100 ms late however short it is set. So no
// channel is made until a plain connect shows that someone listens (looked
// at in slices growing from 5 ms to 200 ms), and a channel refused after
// all is replaced by a fresh one. A channel whose connection is being set
// up is never given up before `timeout`: gRPC 1.51 keeps the connection of
// a channel dropped at that point open for good once the peer answers.
// kDeadlineExceeded after `timeout`; kCancelled as soon as `cancelled` (if
// set) says so, looked at between slices.
absl::StatusOr<std::shared_ptr<grpc::Channel>> DialUnixChannel(
    const std::string& socket_path, absl::Duration timeout,
    const std::function<bool()>& cancelled = nullptr);

// Go's name of a gRPC code ("Unavailable", "DeadlineExceeded"), as in the
// kubelet's "rpc error: code = X desc = Y" error texts.
std::string GoCodeName(grpc::StatusCode code);

// "rpc error: code = Unavailable desc = ...", the text a Go client prints.
std::string GoRpcError(const grpc::Status& s);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_RPC_GRPC_UTIL_H_
