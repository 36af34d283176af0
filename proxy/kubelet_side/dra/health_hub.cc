#include "proxy/kubelet_side/dra/health_hub.h"

#include <type_traits>

#include "proto/dra_health/v1/api.grpc.pb.h"
#include "proto/dra_health/v1alpha1/api.grpc.pb.h"
#include "proxy/rpc/newest_writer.h"

namespace dpproxy {

namespace health = ::v1alpha1;

// One NodeWatchResources stream of either version (NewestWriter: the
// newest state, one write in flight).
template <typename Msg>
class HealthHub::Stream final : public NewestWriter<Msg>, public HealthHub::Watcher {
 public:
  explicit Stream(HealthHub* hub) : hub_(hub) { hub_->Add(this); }

  void Tell(uint64_t version, const std::shared_ptr<const Message>& alpha,
            const std::shared_ptr<const MessageV1>& v1) override {
    if constexpr (std::is_same_v<Msg, MessageV1>) {
      this->Publish(version, [v1] { return v1; });
    } else {
      this->Publish(version, [alpha] { return alpha; });
    }
  }
  void FinishNow() override { NewestWriter<Msg>::FinishNow(); }

 private:
  void OnFinished() override { hub_->Remove(this); }  // no Publish runs after this

  HealthHub* const hub_;
};

// DRAResourceHealth of package v1 (`Api` = ::v1) or v1alpha1.
template <typename Api>
class HealthHub::Service final : public Api::DRAResourceHealth::CallbackService {
 public:
  using Msg = typename Api::NodeWatchResourcesResponse;
  explicit Service(HealthHub* hub) : hub_(hub) {}
  grpc::ServerWriteReactor<Msg>* NodeWatchResources(
      grpc::CallbackServerContext*, const typename Api::NodeWatchResourcesRequest*) override {
    return new Stream<Msg>(hub_);
  }

 private:
  HealthHub* const hub_;
};

// The namespaces of the generated code, as template arguments.
struct HealthV1 {
  using DRAResourceHealth = ::v1::DRAResourceHealth;
  using NodeWatchResourcesRequest = ::v1::NodeWatchResourcesRequest;
  using NodeWatchResourcesResponse = ::v1::NodeWatchResourcesResponse;
};
struct HealthV1Alpha1 {
  using DRAResourceHealth = ::v1alpha1::DRAResourceHealth;
  using NodeWatchResourcesRequest = ::v1alpha1::NodeWatchResourcesRequest;
  using NodeWatchResourcesResponse = ::v1alpha1::NodeWatchResourcesResponse;
};

HealthHub::HealthHub()
    : service_v1_(std::make_unique<Service<HealthV1>>(this)),
      service_v1alpha1_(std::make_unique<Service<HealthV1Alpha1>>(this)) {}

HealthHub::~HealthHub() { Stop(); }

std::vector<grpc::Service*> HealthHub::services() {
  return {service_v1_.get(), service_v1alpha1_.get()};
}

int HealthHub::streams() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

HealthHub::State HealthHub::Current() {
  absl::MutexLock lock(&mu_);
  return {current_, current_v1_, version_};
}

void HealthHub::Add(Watcher* s) {
  absl::MutexLock notify(&notify_mu_);
  const State state = Current();
  bool stopped;
  {
    absl::MutexLock lock(&mu_);
    streams_.insert(s);
    stopped = stopped_;
  }
  if (stopped) {
    s->FinishNow();
  } else if (state.alpha != nullptr) {
    s->Tell(state.version, state.alpha, state.v1);
  }
}

void HealthHub::Remove(Watcher* s) {
  absl::MutexLock notify(&notify_mu_);
  absl::MutexLock lock(&mu_);
  streams_.erase(s);
}

void HealthHub::SetPool(const std::string& pool, const std::vector<DeviceHealthEntry>& devices,
                        absl::Time now) {
  // Held across the notification: a stream is removed only between two.
  absl::MutexLock notify_lock(&notify_mu_);
  std::vector<Watcher*> notify;
  State state;
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
    // The same bytes, as the v1 message: the two versions are one wire.
    auto v1 = std::make_shared<MessageV1>();
    v1->ParseFromString(msg->SerializeAsString());
    current_ = std::move(msg);
    current_v1_ = std::move(v1);
    state = {current_, current_v1_, ++version_};
    notify.assign(streams_.begin(), streams_.end());
  }
  for (Watcher* s : notify) s->Tell(state.version, state.alpha, state.v1);
}

void HealthHub::Stop() {
  absl::MutexLock notify_lock(&notify_mu_);
  std::vector<Watcher*> open;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    open.assign(streams_.begin(), streams_.end());
  }
  for (Watcher* s : open) s->FinishNow();
}

}  // namespace dpproxy
