#include "proxy/state/state_keeper.h"

#include <glog/logging.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dpproxy {

StateKeeper::StateKeeper(std::string path, EventLog* events)
    : store_(std::move(path)), events_(events) {}

state::State StateKeeper::Load() {
  absl::StatusOr<state::State> s = store_.Load();
  absl::MutexLock lock(&mu_);
  if (s.ok()) {
    state_ = *std::move(s);
    LOG(INFO) << "state loaded from " << store_.path() << ": " << state_.resources_size()
              << " resources, " << state_.allocations_size() << " allocations";
    events_->Emit("state_loaded", {{"path", store_.path()},
                                   {"resources", state_.resources_size()},
                                   {"allocations", state_.allocations_size()}});
  } else {
    state_ = state::State();
    LOG(ERROR) << s.status().message();
    events_->Emit("state_untrusted", {{"path", store_.path()},
                                      {"error", std::string(s.status().message())}});
  }
  return state_;
}

absl::Status StateKeeper::SaveLocked() {
  state_.set_saved_unix_ms(absl::ToUnixMillis(absl::Now()));
  absl::Status s = store_.Save(state_);
  if (!s.ok()) {
    LOG(ERROR) << "cannot save state to " << store_.path() << " (the previous file is intact): "
               << s.message();
    events_->Emit("state_save_failed", {{"path", store_.path()},
                                        {"error", std::string(s.message())},
                                        {"failures", store_.save_failures()}});
  }
  return s;
}

absl::Status StateKeeper::Record(const std::string& resource,
                                 const v1beta1::AllocateRequest& req,
                                 const v1beta1::AllocateResponse& resp,
                                 const std::string& backend_api,
                                 const std::string& backend_endpoint) {
  absl::MutexLock lock(&mu_);
  const int before = state_.allocations_size();
  const uint64_t next_before = state_.next_allocation_id();
  const int64_t now = absl::ToUnixMillis(absl::Now());
  for (int i = 0; i < req.container_requests_size(); ++i) {
    state::Allocation* a = state_.add_allocations();
    a->set_id(state_.next_allocation_id() + 1);
    state_.set_next_allocation_id(a->id());
    a->set_resource(resource);
    for (const std::string& id : req.container_requests(i).devices_ids()) a->add_device_ids(id);
    if (i < resp.container_responses_size()) *a->mutable_response() = resp.container_responses(i);
    a->set_backend_api(backend_api);
    a->set_backend_endpoint(backend_endpoint);
    a->set_allocated_unix_ms(now);
  }
  absl::Status s = SaveLocked();
  if (!s.ok()) {
    // Nothing recorded: the caller fails the Allocate.
    while (state_.allocations_size() > before) state_.mutable_allocations()->RemoveLast();
    state_.set_next_allocation_id(next_before);
  }
  return s;
}

absl::Status StateKeeper::SetResources(std::vector<state::Resource> resources) {
  std::sort(resources.begin(), resources.end(),
            [](const state::Resource& a, const state::Resource& b) { return a.name() < b.name(); });
  absl::MutexLock lock(&mu_);
  // Compare without the timestamps: only real changes are saved.
  auto key = [](const state::Resource& r) {
    state::Resource c = r;
    c.clear_updated_unix_ms();
    return c.SerializeAsString();
  };
  bool changed = static_cast<int>(resources.size()) != state_.resources_size();
  for (size_t i = 0; !changed && i < resources.size(); ++i) {
    changed = key(resources[i]) != key(state_.resources(static_cast<int>(i)));
  }
  if (!changed) return absl::OkStatus();
  state_.clear_resources();
  const int64_t now = absl::ToUnixMillis(absl::Now());
  for (state::Resource& r : resources) {
    r.set_updated_unix_ms(now);
    *state_.add_resources() = std::move(r);
  }
  return SaveLocked();
}

absl::Status StateKeeper::Release(const std::vector<uint64_t>& ids) {
  if (ids.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto* a = state_.mutable_allocations();
  a->erase(std::remove_if(a->begin(), a->end(),
                          [&](const state::Allocation& x) {
                            return std::find(ids.begin(), ids.end(), x.id()) != ids.end();
                          }),
           a->end());
  return SaveLocked();
}

absl::Status StateKeeper::Annotate(uint64_t id, const std::string& pod_namespace,
                                   const std::string& pod_name, const std::string& container) {
  absl::MutexLock lock(&mu_);
  for (state::Allocation& a : *state_.mutable_allocations()) {
    if (a.id() != id) continue;
    if (a.pod_namespace() == pod_namespace && a.pod_name() == pod_name &&
        a.container() == container) {
      return absl::OkStatus();
    }
    a.set_pod_namespace(pod_namespace);
    a.set_pod_name(pod_name);
    a.set_container(container);
    return SaveLocked();
  }
  return absl::NotFoundError(absl::StrCat("no allocation ", id));
}

bool StateKeeper::HoldsDevice(const std::string& resource, const std::string& id) {
  absl::MutexLock lock(&mu_);
  for (const state::Allocation& a : state_.allocations()) {
    if (a.resource() != resource) continue;
    for (const std::string& d : a.device_ids()) {
      if (d == id) return true;
    }
  }
  return false;
}

state::State StateKeeper::Snapshot() {
  absl::MutexLock lock(&mu_);
  return state_;
}

}  // namespace dpproxy
