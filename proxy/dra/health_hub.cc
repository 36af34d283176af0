#include "proxy/dra/health_hub.h"

#include "proto/dra_health/v1alpha1/api.grpc.pb.h"

namespace dpproxy {

namespace health = ::v1alpha1;

// One NodeWatchResources stream: the current state at once, then the
// newest after each change, one write in flight.
class HealthHub::Stream final : public grpc::ServerWriteReactor<HealthHub::Message> {
 public:
  explicit Stream(HealthHub* hub) : hub_(hub) { hub_->Add(this); }

  // A state of the hub's (called under its notification lock, never after
  // Remove): written when the write in flight is done.
  void Publish(std::shared_ptr<const Message> state, uint64_t version) {
    {
      absl::MutexLock lock(&mu_);
      if (state == nullptr || version <= latest_version_) return;
      latest_ = std::move(state);
      latest_version_ = version;
    }
    Next();
  }
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
      if (!ok) finishing_ = true;  // the kubelet is gone
    }
    Next();
  }
  void OnCancel() override { FinishNow(); }
  void OnDone() override {
    hub_->Remove(this);  // no Publish runs after this
    delete this;
  }

 private:
  // Starts the next write or the finish, if one is due; gRPC is called
  // without mu_ held, and the flags make each start happen once.
  void Next() {
    std::shared_ptr<const Message> write;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (finishing_) {
        finished_ = finish = true;
      } else if (latest_ != nullptr && latest_version_ != sent_) {
        in_flight_ = write = latest_;
        sent_ = latest_version_;
        writing_ = true;
      }
    }
    if (finish) {
      Finish(grpc::Status::OK);
    } else if (write != nullptr) {
      StartWrite(write.get());
    }
  }

  HealthHub* const hub_;
  absl::Mutex mu_;
  std::shared_ptr<const Message> latest_ ABSL_GUARDED_BY(mu_);
  uint64_t latest_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<const Message> in_flight_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class HealthHub::Service final : public health::DRAResourceHealth::CallbackService {
 public:
  explicit Service(HealthHub* hub) : hub_(hub) {}
  grpc::ServerWriteReactor<Message>* NodeWatchResources(
      grpc::CallbackServerContext*, const health::NodeWatchResourcesRequest*) override {
    return new Stream(hub_);
  }

 private:
  HealthHub* const hub_;
};

HealthHub::HealthHub() : service_(std::make_unique<Service>(this)) {}

HealthHub::~HealthHub() { Stop(); }

grpc::Service* HealthHub::service() { return service_.get(); }

int HealthHub::streams() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

std::pair<std::shared_ptr<const HealthHub::Message>, uint64_t> HealthHub::Current() {
  absl::MutexLock lock(&mu_);
  return {current_, version_};
}

void HealthHub::Add(Stream* s) {
  absl::MutexLock notify(&notify_mu_);
  auto [state, version] = Current();
  bool stopped;
  {
    absl::MutexLock lock(&mu_);
    streams_.insert(s);
    stopped = stopped_;
  }
  if (stopped) {
    s->FinishNow();
  } else {
    s->Publish(std::move(state), version);
  }
}

void HealthHub::Remove(Stream* s) {
  absl::MutexLock notify(&notify_mu_);
  absl::MutexLock lock(&mu_);
  streams_.erase(s);
}

void HealthHub::SetPool(const std::string& pool, const std::vector<DeviceHealthEntry>& devices,
                        absl::Time now) {
  // Held across the notification: a stream is removed only between two.
  absl::MutexLock notify_lock(&notify_mu_);
  std::vector<Stream*> notify;
  std::shared_ptr<const Message> state;
  uint64_t version;
  {
    absl::MutexLock lock(&mu_);
    std::map<std::string, Known>& known = pools_[pool];
    std::map<std::string, Known> next;
    bool changed = known.size() != devices.size() || current_ == nullptr;
    for (const DeviceHealthEntry& d : devices) {
      Known k{d, absl::ToUnixSeconds(now)};
      auto it = known.find(d.device);
      if (it != known.end() && it->second.entry.health == d.health &&
          it->second.entry.message == d.message) {
        k.updated_unix = it->second.updated_unix;
      } else {
        changed = true;
      }
      next[d.device] = std::move(k);
    }
    if (!changed) return;
    known = std::move(next);
    auto msg = std::make_shared<Message>();
    for (const auto& [pool_name, devs] : pools_) {
      for (const auto& [name, k] : devs) {
        health::DeviceHealth* h = msg->add_devices();
        h->mutable_device()->set_pool_name(pool_name);
        h->mutable_device()->set_device_name(name);
        h->set_health(k.entry.health == DeviceHealthEntry::Health::kHealthy     ? health::HEALTHY
                      : k.entry.health == DeviceHealthEntry::Health::kUnhealthy ? health::UNHEALTHY
                                                                                : health::UNKNOWN);
        h->set_last_updated_time(k.updated_unix);
        h->set_message(k.entry.message);
      }
    }
    current_ = std::move(msg);
    state = current_;
    version = ++version_;
    notify.assign(streams_.begin(), streams_.end());
  }
  for (Stream* s : notify) s->Publish(state, version);
}

void HealthHub::Stop() {
  absl::MutexLock notify_lock(&notify_mu_);
  std::vector<Stream*> open;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    open.assign(streams_.begin(), streams_.end());
  }
  for (Stream* s : open) s->FinishNow();
}

}  // namespace dpproxy
