// bare_hop: the floor of a forwarding proxy, for allocate_bench. It serves
// v1beta1 Allocate on one Unix socket and forwards each call, unchanged and
// with nothing else done, to a plugin's socket over one channel made at
// start, with the gRPC API style dpproxy's Allocate uses (callback API on
// both sides). No checks, no ID mapping, no journal, no events: whatever dpproxy
// costs beyond this is the price of what it does.
#include <signal.h>

#include <iostream>
#include <memory>
#include <string>

#include <gflags/gflags.h>

#include "absl/synchronization/mutex.h"
#include <grpcpp/client_context.h>
#include <grpcpp/server_builder.h>

#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/cli/cli.h"
#include "proxy/rpc/grpc_util.h"

DEFINE_string(listen, "", "Unix socket to serve v1beta1 Allocate on.");
DEFINE_string(target, "", "Unix socket of the v1beta1 plugin to forward to.");

namespace dpproxy {
namespace {

// The forwarding, with the callback API on both sides as dpproxy's Allocate:
// the server's reactor finishes when the plugin's answer arrives, on gRPC's
// threads; no thread waits on a call.
class CallbackForwarder final : public v1beta1::DevicePlugin::CallbackService {
 public:
  explicit CallbackForwarder(const std::string& target)
      : stub_(v1beta1::DevicePlugin::NewStub(MakeUnixChannel(target))) {}

  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* server_ctx,
                                     const v1beta1::AllocateRequest* req,
                                     v1beta1::AllocateResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = server_ctx->DefaultReactor();
    auto ctx = grpc::ClientContext::FromCallbackServerContext(*server_ctx);
    grpc::ClientContext* raw = ctx.release();
    stub_->async()->Allocate(raw, req, resp, [reactor, raw](grpc::Status s) {
      delete raw;
      reactor->Finish(s);
    });
    return reactor;
  }

 private:
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
};

int Run() {
  if (FLAGS_listen.empty() || FLAGS_target.empty()) {
    std::cerr << "bare_hop: --listen and --target are required\n";
    return 2;
  }
  CallbackForwarder forwarder(FLAGS_target);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + FLAGS_listen, grpc::InsecureServerCredentials());
  builder.RegisterService(&forwarder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::cerr << "bare_hop: cannot listen on " << FLAGS_listen << "\n";
    return 1;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int sig = 0;
  sigwait(&set, &sig);
  server->Shutdown();
  return 0;
}

}  // namespace
}  // namespace dpproxy

int main(int argc, char** argv) {
  if (dpproxy::WantsHelp(argc, argv)) {
    std::cout << "bare_hop --listen=SOCKET --target=PLUGIN_SOCKET: the floor of a forwarding\n"
                 "proxy, for allocate_bench.\n\nFlags:\n"
              << dpproxy::FlagsHelp({"bench/bare_hop.cc"});
    return 0;
  }
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  // As dpproxy runs (proxy/main.cc): Abseil's lock-order graph off, so the
  // floor does not pay for a check the daemon does not make.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return dpproxy::Run();
}
