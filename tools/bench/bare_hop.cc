// bare_hop: the floor of a forwarding proxy, for allocate_bench. It serves
// v1beta1 Allocate on one Unix socket and forwards each call, unchanged and
// with nothing else done, to a plugin's socket over one channel made at
// start, with the gRPC API style dpproxy's Allocate uses (callback API on
// both sides). No checks, no ID mapping, no journal, no events: whatever dpproxy
// costs beyond this is the price of what it does.
//
// With --journal=FILE it is the floor of a forwarder that makes each call
// durable before answering it: the request's bytes are written to FILE and
// fdatasync'd while the plugin is called (as dpproxy's reservation), and the
// answer waits for both. Writes are group-committed as dpproxy's journal
// does them: a call that finds the file free writes and syncs on its own
// thread, then goes on with whatever queued meanwhile, one write and one
// fdatasync per batch. FILE is written full of zeros and synced at start and
// then overwritten in a ring, so a sync never writes the file's size. No
// record is read back: nothing but the durable write is paid for.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gflags/gflags.h>

#include "absl/synchronization/mutex.h"
#include <grpcpp/client_context.h>
#include <grpcpp/server_builder.h>

#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/cli/cli.h"
#include "proxy/rpc/grpc_util.h"

DEFINE_string(listen, "", "Unix socket to serve v1beta1 Allocate on.");
DEFINE_string(target, "", "Unix socket of the v1beta1 plugin to forward to.");
DEFINE_string(journal, "",
              "A file to make each call durable in before it is answered (the floor of "
              "a forwarder with a journal); created, or overwritten, with 8 MiB of zeros. "
              "Empty: calls are only forwarded.");

namespace dpproxy {
namespace {

constexpr size_t kJournalBytes = 8 << 20;

// Group commit over a ring of preallocated bytes (see the file comment).
class RingJournal {
 public:
  // An error names the file and what failed.
  bool Open(const std::string& path, std::string* error) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0) {
      *error = "cannot open " + path + ": " + std::strerror(errno);
      return false;
    }
    const std::string zeros(1 << 20, '\0');
    for (size_t at = 0; at < kJournalBytes; at += zeros.size()) {
      if (::pwrite(fd_, zeros.data(), zeros.size(), static_cast<off_t>(at)) !=
          static_cast<ssize_t>(zeros.size())) {
        *error = "cannot write " + path + ": " + std::strerror(errno);
        return false;
      }
    }
    if (::fsync(fd_) != 0) {
      *error = "cannot sync " + path + ": " + std::strerror(errno);
      return false;
    }
    return true;
  }

  // `done` runs once `record` is durable, on this thread or the writer's.
  void Append(std::string record, std::function<void(bool)> done) {
    {
      absl::MutexLock lock(&mu_);
      queue_.push_back({std::move(record), std::move(done)});
      if (busy_) return;  // the writer at work takes it with its next batch
      busy_ = true;
    }
    WriteQueued();
  }

 private:
  struct Entry {
    std::string record;
    std::function<void(bool)> done;
  };

  void WriteQueued() {
    std::vector<Entry> batch;
    absl::MutexLock lock(&mu_);
    while (!queue_.empty()) {
      batch.swap(queue_);
      queue_.clear();
      std::string data;
      for (const Entry& e : batch) data += e.record;
      mu_.Unlock();
      if (at_ + data.size() > kJournalBytes) at_ = 0;
      const bool ok = data.size() <= kJournalBytes &&
                      ::pwrite(fd_, data.data(), data.size(), static_cast<off_t>(at_)) ==
                          static_cast<ssize_t>(data.size()) &&
                      ::fdatasync(fd_) == 0;
      at_ += data.size();
      for (Entry& e : batch) e.done(ok);
      batch.clear();
      mu_.Lock();
    }
    busy_ = false;
  }

  int fd_ = -1;
  size_t at_ = 0;  // the writer's alone
  absl::Mutex mu_;
  std::vector<Entry> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
};

// The forwarding, with the callback API on both sides as dpproxy's Allocate:
// the server's reactor finishes when the plugin's answer arrives (and, with
// a journal, the request is durable), on gRPC's threads or the journal's
// writer; no thread waits on a call.
class CallbackForwarder final : public v1beta1::DevicePlugin::CallbackService {
 public:
  CallbackForwarder(const std::string& target, RingJournal* journal)
      : stub_(v1beta1::DevicePlugin::NewStub(MakeUnixChannel(target))), journal_(journal) {}

  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* server_ctx,
                                     const v1beta1::AllocateRequest* req,
                                     v1beta1::AllocateResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = server_ctx->DefaultReactor();
    auto ctx = grpc::ClientContext::FromCallbackServerContext(*server_ctx);
    grpc::ClientContext* raw = ctx.release();
    if (journal_ == nullptr) {
      stub_->async()->Allocate(raw, req, resp, [reactor, raw](grpc::Status s) {
        delete raw;
        reactor->Finish(s);
      });
      return reactor;
    }
    // The plugin's answer and the record's sync each arrive once; the
    // last one finishes the call.
    struct Join {
      grpc::ServerUnaryReactor* reactor = nullptr;
      grpc::ClientContext* ctx = nullptr;
      grpc::Status status;
      bool durable = false;
      std::atomic<int> arrivals{2};
      void Arrive() {
        if (arrivals.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
        delete ctx;
        reactor->Finish(durable ? status
                                : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                               "bare_hop: the journal write failed"));
        delete this;
      }
    };
    Join* join = new Join;
    join->reactor = reactor;
    join->ctx = raw;
    stub_->async()->Allocate(raw, req, resp, [join](grpc::Status s) {
      join->status = std::move(s);
      join->Arrive();
    });
    journal_->Append(req->SerializeAsString(), [join](bool ok) {
      join->durable = ok;
      join->Arrive();
    });
    return reactor;
  }

 private:
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
  RingJournal* const journal_;
};

int Run() {
  if (FLAGS_listen.empty() || FLAGS_target.empty()) {
    std::cerr << "bare_hop: --listen and --target are required\n";
    return 2;
  }
  std::unique_ptr<RingJournal> journal;
  if (!FLAGS_journal.empty()) {
    journal = std::make_unique<RingJournal>();
    if (std::string error; !journal->Open(FLAGS_journal, &error)) {
      std::cerr << "bare_hop: --journal: " << error << "\n";
      return 1;
    }
  }
  CallbackForwarder forwarder(FLAGS_target, journal.get());
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
    std::cout << "bare_hop --listen=SOCKET --target=PLUGIN_SOCKET [--journal=FILE]: the floor\n"
                 "of a forwarding proxy, for allocate_bench; with --journal, of one that makes\n"
                 "each call durable in FILE before answering it.\n\nFlags:\n"
              << dpproxy::FlagsHelp({"bench/bare_hop.cc"});
    return 0;
  }
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  // As dpproxy runs (proxy/main.cc): Abseil's lock-order graph off, so the
  // floor does not pay for a check the daemon does not make.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return dpproxy::Run();
}
