// File: backend_base.h
//
// What the v1alpha and v1beta1 adapters share: call errors and contexts,
// the one ListAndWatch stream read on gRPC's callback threads (ListReader),
// and BackendBase (the channel, the stream, Stop()).
#ifndef DPPROXY_BACKENDS_BACKEND_BASE_H_
#define DPPROXY_BACKENDS_BACKEND_BASE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/client_callback.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/backend.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/rpc/grpc_status.h"

namespace dpproxy {

// A backend call's error, naming the backend and the call: kDeadlineExceeded
// if it did not answer in time, kUnavailable if it is gone (or the call was
// cancelled), the plugin's own code otherwise.
absl::Status CallError(const std::string& endpoint, const char* call, const grpc::Status& s,
                       absl::Duration timeout);

// A context for a call that serves `caller` (the kubelet's call; may be
// null): its cancellation and deadline carry over (gRPC's parent-call
// propagation). The deadline is `timeout` from now, or the caller's if
// sooner.
std::unique_ptr<grpc::ClientContext> CallContext(const grpc::ServerContextBase* caller,
                                                 absl::Duration timeout);

// The backend's one ListAndWatch stream, read on gRPC's callback threads:
// no thread of ours waits on it. Lists that arrive before Deliver() are kept
// (the newest; a v1alpha probe reads the first list before the backend is
// attached). After Stop() returns no callback runs; Stop() from within a
// callback returns at once (the stream ends by itself, and the reader keeps
// itself alive until gRPC is done with it).
class ListStream {
 public:
  virtual ~ListStream() = default;
  // Waits up to `timeout` for the first list or the end of the stream;
  // true if a list came.
  virtual bool WaitForFirst(absl::Duration timeout) = 0;
  // Starts delivering lists (first any kept one) and, once, the end.
  virtual void Deliver(std::function<void(std::vector<v1beta1::Device>)> on_devices,
                       std::function<void(const grpc::Status&)> on_end) = 0;
  // How the stream ended (only meaningful once it has).
  virtual grpc::Status status() = 0;
  virtual void Stop() = 0;
};

template <typename Request, typename Msg>
class ListReader final : public grpc::ClientReadReactor<Msg>,
                         public ListStream,
                         public std::enable_shared_from_this<ListReader<Request, Msg>> {
 public:
  // May take the devices out of the message (it is dropped after).
  using Translate = std::function<std::vector<v1beta1::Device>(Msg&)>;
  using Open = std::function<void(grpc::ClientContext*, const Request*, grpc::ClientReadReactor<Msg>*)>;

  static std::shared_ptr<ListReader> Start(const Open& open, Translate translate) {
    auto r = std::shared_ptr<ListReader>(new ListReader(std::move(translate)));
    {
      absl::MutexLock lock(&r->mu_);
      r->self_ = r;  // alive until gRPC is done with it (OnDone)
    }
    open(&r->ctx_, &r->request_, r.get());
    r->StartRead(&r->msg_);
    r->StartCall();
    return r;
  }

  bool WaitForFirst(absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](ListReader* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
                               return r->kept_.has_value() || r->done_;
                             },
                             this),
                         timeout);
    return kept_.has_value();
  }

  void Deliver(std::function<void(std::vector<v1beta1::Device>)> on_devices,
               std::function<void(const grpc::Status&)> on_end) override {
    std::optional<Msg> kept;
    bool ended;
    {
      absl::MutexLock lock(&mu_);
      on_devices_ = std::move(on_devices);
      on_end_ = std::move(on_end);
      kept.swap(kept_);
      ended = done_ && !end_delivered_;
      end_delivered_ = end_delivered_ || ended;
      // Callbacks run one at a time, in order: gRPC's wait until these are
      // delivered.
      delivering_ = true;
    }
    if (kept.has_value()) on_devices_(translate_(*kept));
    if (ended) on_end_(status());
    absl::MutexLock lock(&mu_);
    delivering_ = false;
    started_ = true;
  }

  grpc::Status status() override {
    absl::MutexLock lock(&mu_);
    return status_;
  }

  void Stop() override {
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
      if (std::this_thread::get_id() == callback_thread_) return;  // ends by itself
    }
    ctx_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&finished_));
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    if (Enter(/*end=*/false)) {
      on_devices_(translate_(msg_));
      Leave();
    }
    // Cleared, a message keeps every device object for reuse: a copy of
    // the whole list per backend, for as long as the stream is quiet.
    msg_ = Msg();
    this->StartRead(&msg_);
  }

  void OnDone(const grpc::Status& s) override {
    {
      absl::MutexLock lock(&mu_);
      status_ = s;
      done_ = true;
    }
    if (Enter(/*end=*/true)) {
      on_end_(s);
      Leave();
    }
    std::shared_ptr<ListReader> keep;
    absl::MutexLock lock(&mu_);
    finished_ = true;
    keep.swap(self_);  // released after the lock, as the last thing done
  }

 private:
  explicit ListReader(Translate translate) : translate_(std::move(translate)) {}

  // Decides, in one step, what a read or the end becomes: delivered now
  // (true: this thread is marked as in a callback until Leave()), kept for
  // Deliver() (a list before it), or dropped (after Stop(), or an end
  // Deliver() already reported). Waits while Deliver() hands over a kept
  // list, so the order holds.
  bool Enter(bool end) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](ListReader* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return !r->delivering_; },
        this));
    if (stopped_) return false;
    if (!started_) {
      if (!end) kept_ = msg_;  // the newest list, for Deliver()
      return false;
    }
    if (end) {
      if (end_delivered_) return false;
      end_delivered_ = true;
    }
    callback_thread_ = std::this_thread::get_id();
    return true;
  }
  void Leave() {
    absl::MutexLock lock(&mu_);
    callback_thread_ = std::thread::id();
  }

  const Translate translate_;
  grpc::ClientContext ctx_;
  Request request_;
  Msg msg_;  // the read in flight; touched only by gRPC and its callbacks
  absl::Mutex mu_;
  std::optional<Msg> kept_ ABSL_GUARDED_BY(mu_);
  std::function<void(std::vector<v1beta1::Device>)> on_devices_;  // set once, before started_
  std::function<void(const grpc::Status&)> on_end_;
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool end_delivered_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread::id callback_thread_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ListReader> self_ ABSL_GUARDED_BY(mu_);
};

// What both adapters share: the channel, the one stream, Stop().
class BackendBase : public Backend {
 public:
  BackendBase(std::string resource, std::string endpoint, std::shared_ptr<grpc::Channel> ch)
      : resource_(std::move(resource)), endpoint_(std::move(endpoint)), channel_(std::move(ch)) {}
  ~BackendBase() override { Stop(); }

  const std::string& endpoint() const override { return endpoint_; }
  const std::string& resource() const override { return resource_; }

  void Start(BackendCallbacks callbacks) override {
    std::shared_ptr<ListStream> stream;
    {
      absl::MutexLock lock(&mu_);
      if (started_ || stopped_) return;
      started_ = true;
      stream_ = OpenList();
      stream = stream_;
    }
    stream->Deliver(
        [cb = callbacks](std::vector<v1beta1::Device> d) {
          if (cb.on_devices) cb.on_devices(std::move(d));
        },
        [cb = callbacks](const grpc::Status& s) {
          if (cb.on_lost) cb.on_lost(DescribeGrpcStatus(s));
        });
  }

  void Stop() override {
    std::shared_ptr<ListStream> stream;
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
      stream = stream_;
    }
    if (stream != nullptr) stream->Stop();
  }

 protected:
  // The one stream: opened now, or the one a probe already opened.
  virtual std::shared_ptr<ListStream> OpenList() = 0;

  const std::string resource_;
  const std::string endpoint_;
  const std::shared_ptr<grpc::Channel> channel_;

 private:
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ListStream> stream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dpproxy

#endif  // DPPROXY_BACKENDS_BACKEND_BASE_H_
