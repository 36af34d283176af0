// File: newest_writer.h
//
// A server stream that always sends the newest state with one write in
// flight, served without a thread of its own (gRPC's callback API): states
// published while a write is under way fold into the newest, which is
// written when that write completes; an older or repeated version is
// ignored. The message is made only when it is about to be written, so a
// state overtaken before its turn costs nothing. The stream finishes OK
// when FinishNow() is called, and at once when the client goes away; the
// subclass learns of the end in OnFinished() (then the object deletes
// itself).
//
//   class Stream : public NewestWriter<Msg> {
//     void OnFinished() override { hub->Remove(this); }
//   };
//   stream->Publish(version, [state] { return state; });
#ifndef DPPROXY_PROXY_RPC_NEWEST_WRITER_H_
#define DPPROXY_PROXY_RPC_NEWEST_WRITER_H_

#include <cstdint>
#include <functional>
#include <memory>

#include <grpcpp/support/server_callback.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dpproxy {

template <typename Msg>
class NewestWriter : public grpc::ServerWriteReactor<Msg> {
 public:
  using Make = std::function<std::shared_ptr<const Msg>()>;

  // The state of `version` (1 and up: 0 stands for nothing to send yet),
  // made by `make` when its write starts.
  void Publish(uint64_t version, Make make) {
    {
      absl::MutexLock lock(&mu_);
      if (make == nullptr || (latest_ != nullptr && version <= latest_version_)) return;
      latest_ = std::move(make);
      latest_version_ = version;
    }
    Next();
  }

  // Finishes the stream once the write in flight (if any) is done.
  void FinishNow() {
    {
      absl::MutexLock lock(&mu_);
      finishing_ = true;
    }
    Next();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      in_flight_.reset();
      if (!ok) finishing_ = ended_by_client_ = true;  // the client is gone
    }
    Next();
  }
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      ended_by_client_ = true;
    }
    FinishNow();
  }
  void OnDone() override {
    OnFinished();
    delete this;
  }

 protected:
  // After the last callback: unregister from whatever publishes (no
  // Publish may run once this returns).
  virtual void OnFinished() = 0;
  // Whether the stream ended because the client went away or cancelled it
  // (not by FinishNow()). For OnFinished().
  bool ended_by_client() {
    absl::MutexLock lock(&mu_);
    return ended_by_client_;
  }

 private:
  // Starts the next write or the finish, if one is due. gRPC is called
  // without mu_ held; the flags make each start happen once.
  void Next() {
    Make make;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (finishing_) {
        finished_ = finish = true;
      } else if (latest_ != nullptr && latest_version_ != sent_version_) {
        make = latest_;
        sent_version_ = latest_version_;
        writing_ = true;
      }
    }
    if (finish) {
      this->Finish(grpc::Status::OK);
      return;
    }
    if (make == nullptr) return;
    std::shared_ptr<const Msg> msg = make();  // kept until the write is done
    const Msg* raw = msg.get();
    {
      absl::MutexLock lock(&mu_);
      in_flight_ = std::move(msg);
    }
    this->StartWrite(raw);
  }

  absl::Mutex mu_;
  bool ended_by_client_ ABSL_GUARDED_BY(mu_) = false;
  Make latest_ ABSL_GUARDED_BY(mu_);
  uint64_t latest_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t sent_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<const Msg> in_flight_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_RPC_NEWEST_WRITER_H_
