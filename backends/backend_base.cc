#include "backends/backend_base.h"

#include <set>

#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/str_cat.h"

namespace dpproxy {

// A backend call's error, naming the backend and the call.
absl::Status CallError(const std::string& endpoint, const char* call, const grpc::Status& s,
                       absl::Duration timeout) {
  switch (s.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(
          absl::StrCat("backend ", endpoint, " did not answer ", call, " within ",
                       absl::FormatDuration(timeout)));
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
      return absl::UnavailableError(absl::StrCat("backend ", endpoint, " is unavailable during ",
                                                 call, ": ", s.error_message()));
    default:
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("backend ", endpoint, " failed ", call, ": ",
                                       s.error_message()));
  }
}

std::unique_ptr<grpc::ClientContext> CallContext(const grpc::ServerContextBase* caller,
                                                 absl::Duration timeout) {
  std::unique_ptr<grpc::ClientContext> ctx =
      caller == nullptr ? std::make_unique<grpc::ClientContext>()
                        : grpc::ClientContext::FromServerContext(*caller);
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

std::shared_ptr<ListReader> ListReader::Start(grpc::ChannelInterface* channel,
                                              const grpc::internal::RpcMethod& method,
                                              bool with_topology) {
  auto r = std::shared_ptr<ListReader>(new ListReader(with_topology));
  {
    absl::MutexLock lock(&r->mu_);
    r->self_ = r;  // alive until gRPC is done with it (OnDone)
  }
  // What a generated stub's async()->ListAndWatch does, with the message
  // type grpc::ByteBuffer: gRPC's public API has no raw client stub for a
  // server-streaming method.
  grpc::internal::ClientCallbackReaderFactory<grpc::ByteBuffer>::Create(
      channel, method, &r->ctx_, &r->request_, r.get());
  r->StartRead(&r->msg_);
  r->StartCall();
  return r;
}

ListReader::ListReader(bool with_topology) : with_topology_(with_topology) {
  grpc::Slice empty;
  request_ = grpc::ByteBuffer(&empty, 1);
}

bool ListReader::WaitForFirst(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(
                           +[](ListReader* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
                             return r->kept_ != nullptr || r->done_;
                           },
                           this),
                       timeout);
  return kept_ != nullptr;
}

void ListReader::Deliver(std::function<void(std::shared_ptr<const DeviceList>)> on_devices,
                         std::function<void(const grpc::Status&)> on_end) {
  std::shared_ptr<const DeviceList> kept;
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
  if (kept != nullptr) on_devices_(std::move(kept));
  if (ended) on_end_(status());
  absl::MutexLock lock(&mu_);
  delivering_ = false;
  started_ = true;
}

grpc::Status ListReader::status() {
  absl::MutexLock lock(&mu_);
  return status_;
}

void ListReader::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    if (std::this_thread::get_id() == callback_thread_) return;  // ends by itself
  }
  ctx_.TryCancel();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&finished_));
}

void ListReader::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  absl::StatusOr<std::shared_ptr<const DeviceList>> list;
  {
    // The message's bytes, in one piece (gRPC hands a large message over
    // in slices); dropped before the list is delivered.
    std::vector<grpc::Slice> slices;
    std::string joined;
    absl::string_view bytes;
    if (msg_.Dump(&slices).ok() && slices.size() == 1) {
      bytes = absl::string_view(reinterpret_cast<const char*>(slices[0].begin()),
                                slices[0].size());
    } else {
      joined.reserve(msg_.Length());
      for (const grpc::Slice& sl : slices) {
        joined.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
      bytes = joined;
    }
    list = DeviceList::FromWire(bytes, with_topology_);
    msg_.Clear();
  }
  if (!list.ok()) {
    {
      absl::MutexLock lock(&mu_);
      refused_ = grpc::Status(grpc::StatusCode::INTERNAL,
                              absl::StrCat("the plugin sent a ListAndWatchResponse dpproxy "
                                           "cannot read: ",
                                           list.status().message()));
    }
    ctx_.TryCancel();  // OnDone follows, with refused_ as the reason
    return;
  }
  std::shared_ptr<const DeviceList> d = *std::move(list);
  if (Enter(/*end=*/false, &d)) {
    on_devices_(std::move(d));
    Leave();
  }
  StartRead(&msg_);
}

void ListReader::OnDone(const grpc::Status& s) {
  {
    absl::MutexLock lock(&mu_);
    status_ = refused_.value_or(s);
    done_ = true;
  }
  if (Enter(/*end=*/true, nullptr)) {
    on_end_(status());
    Leave();
  }
  std::shared_ptr<ListReader> keep;
  absl::MutexLock lock(&mu_);
  finished_ = true;
  keep.swap(self_);  // released after the lock, as the last thing done
}

bool ListReader::Enter(bool end, std::shared_ptr<const DeviceList>* list) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](ListReader* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return !r->delivering_; },
      this));
  if (stopped_) return false;
  if (!started_) {
    if (!end) kept_ = std::move(*list);  // the newest list, for Deliver()
    return false;
  }
  if (end) {
    if (end_delivered_) return false;
    end_delivered_ = true;
  }
  callback_thread_ = std::this_thread::get_id();
  return true;
}

void ListReader::Leave() {
  absl::MutexLock lock(&mu_);
  callback_thread_ = std::thread::id();
}

class BackendBase::Probes {
 public:
  struct Ask {
    grpc::ClientContext ctx;
    // An empty message: no bytes (a default ByteBuffer is no message at
    // all, which gRPC refuses to send).
    grpc::Slice empty;
    grpc::ByteBuffer request{&empty, 1};
    grpc::ByteBuffer response;
  };
  // Registers `ask`; false once CancelAll() ran (the backend stopped).
  bool Add(Ask* ask) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return false;
    asks_.insert(ask);
    return true;
  }
  void Remove(Ask* ask) {
    absl::MutexLock lock(&mu_);
    asks_.erase(ask);
  }
  void CancelAll() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    // Each ask is alive while listed: its callback removes it first.
    for (Ask* ask : asks_) ask->ctx.TryCancel();
  }

 private:
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::set<Ask*> asks_ ABSL_GUARDED_BY(mu_);
};

BackendBase::BackendBase(std::string resource, std::string endpoint,
                         std::shared_ptr<grpc::Channel> ch)
    : resource_(std::move(resource)),
      endpoint_(std::move(endpoint)),
      channel_(std::move(ch)),
      probes_(std::make_shared<Probes>()) {}

void BackendBase::Stop() {
  std::shared_ptr<ListStream> stream;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    stream = stream_;
  }
  if (stream != nullptr) stream->Stop();
  probes_->CancelAll();
}

void BackendBase::ProbeAsync(absl::Duration timeout, std::function<void(absl::Status)> done) {
  if (channel_ == nullptr) {
    // A test's mock stub: no plugin to ask, and nothing to find silent.
    done(absl::OkStatus());
    return;
  }
  auto ask = std::make_shared<Probes::Ask>();
  ask->ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!probes_->Add(ask.get())) {
    done(absl::CancelledError("backend stopped"));
    return;
  }
  grpc::GenericStub stub(channel_);
  stub.UnaryCall(&ask->ctx, std::string(kWatchdogMethod), grpc::StubOptions(), &ask->request, &ask->response,
                 [ask, probes = probes_, done = std::move(done)](grpc::Status s) {
                   probes->Remove(ask.get());
                   switch (s.error_code()) {
                     case grpc::StatusCode::DEADLINE_EXCEEDED:
                     case grpc::StatusCode::UNAVAILABLE:
                     case grpc::StatusCode::CANCELLED:
                       return done(FromGrpcStatus(s));
                     default:
                       return done(absl::OkStatus());  // it answered
                   }
                 });
}

}  // namespace dpproxy
