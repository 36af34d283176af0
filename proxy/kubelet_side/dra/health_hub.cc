#include "proxy/kubelet_side/dra/health_hub.h"

#include "proto/dra_health/v1/api.grpc.pb.h"
#include "proto/dra_health/v1alpha1/api.grpc.pb.h"
#include "proxy/rpc/newest_writer.h"

namespace dpproxy {

namespace health = ::v1alpha1;

// One NodeWatchResources stream of either version (NewestWriter: the
// newest state, one write in flight).
class HealthHub::Stream final : public NewestWriter<HealthHub::Message> {
 public:
  explicit Stream(HealthHub* hub) : hub_(hub) { hub_->Add(this); }

 private:
  void OnFinished() override { hub_->Remove(this); }  // no Publish runs after this

  HealthHub* const hub_;
};

// DRAResourceHealth of package v1 or v1alpha1 (`Generated`, the generated
// service): the same messages.
template <typename Generated>
class HealthHub::Service final : public Generated::CallbackService {
 public:
  explicit Service(HealthHub* hub) : hub_(hub) {}
  grpc::ServerWriteReactor<Message>* NodeWatchResources(
      grpc::CallbackServerContext*, const health::NodeWatchResourcesRequest*) override {
    return new Stream(hub_);
  }

 private:
  HealthHub* const hub_;
};

HealthHub::HealthHub()
    : service_v1_(std::make_unique<Service<::v1::DRAResourceHealth>>(this)),
      service_v1alpha1_(std::make_unique<Service<health::DRAResourceHealth>>(this)) {}

HealthHub::~HealthHub() { Stop(); }

std::vector<grpc::Service*> HealthHub::services() {
  return {service_v1_.get(), service_v1alpha1_.get()};
}

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
  const std::pair<std::shared_ptr<const Message>, uint64_t> current = Current();
  const std::shared_ptr<const Message>& state = current.first;
  const uint64_t version = current.second;
  bool stopped;
  {
    absl::MutexLock lock(&mu_);
    streams_.insert(s);
    stopped = stopped_;
  }
  if (stopped) {
    s->FinishNow();
  } else if (state != nullptr) {
    s->Publish(version, [state] { return state; });
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
  for (Stream* s : notify) s->Publish(version, [state] { return state; });
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
