#include "proxy/kubelet_side/dra/move_fence.h"

#include <utility>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dpproxy {
namespace {

constexpr char kMoveTaintValue[] = "device-plugin-to-dra";

}  // namespace

void MoveFence::set_client(KubeClient* client) {
  absl::MutexLock lock(&mu_);
  client_ = client;
}

void MoveFence::Fence(const std::string& resource, std::function<void()> withdraw) {
  absl::MutexLock lock(&mu_);
  Move& m = moves_[resource];
  m = Move();
  m.withdraw = std::move(withdraw);
}

bool MoveFence::Cancel(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  auto it = moves_.find(resource);
  if (it == moves_.end()) return false;
  const bool pending = it->second.stage != Move::kWithdrawn;
  moves_.erase(it);
  return pending;
}

bool MoveFence::busy() {
  absl::MutexLock lock(&mu_);
  return !moves_.empty();
}

absl::StatusOr<bool> MoveFence::SetTaint(KubeClient* client, bool on) {
  const std::string path = absl::StrCat("/api/v1/nodes/", node_);
  absl::Status last;
  for (int attempt = 0; attempt < 5; ++attempt) {
    absl::StatusOr<KubeClient::Json> node = client->Get(path);
    if (!node.ok()) return node.status();
    if (!node->is_object()) return absl::InvalidArgumentError(absl::StrCat(path, " is not an object"));
    KubeClient::Json& spec = (*node)["spec"];
    if (!spec.is_object()) spec = KubeClient::Json::object();
    KubeClient::Json taints = spec.value("taints", KubeClient::Json::array());
    if (!taints.is_array()) taints = KubeClient::Json::array();
    KubeClient::Json kept = KubeClient::Json::array();
    bool had = false;
    for (const KubeClient::Json& t : taints) {
      if (t.is_object() && t.value("key", "") == kMoveTaintKey) {
        had = true;
      } else {
        kept.push_back(t);
      }
    }
    if (had == on) return false;
    if (on) {
      kept.push_back({{"key", kMoveTaintKey}, {"value", kMoveTaintValue}, {"effect", "NoSchedule"}});
    }
    if (kept.empty()) {
      spec.erase("taints");
    } else {
      spec["taints"] = std::move(kept);
    }
    // An update at the resourceVersion read: one that lost a race with the
    // kubelet (or anyone) is refused, read again and redone.
    absl::StatusOr<KubeClient::Json> put = client->Put(path, *node);
    if (put.ok()) return true;
    last = put.status();
    if (last.code() != absl::StatusCode::kAborted &&
        last.code() != absl::StatusCode::kAlreadyExists) {
      return last;
    }
  }
  return last;
}

absl::StatusOr<int64_t> MoveFence::StatusAllocatable(KubeClient* client,
                                                     const std::string& resource) {
  const std::string path = absl::StrCat("/api/v1/nodes/", node_);
  absl::StatusOr<KubeClient::Json> node = client->Get(path);
  if (!node.ok()) return node.status();
  const KubeClient::Json* status = node->is_object() && node->contains("status")
                                       ? &(*node)["status"]
                                       : nullptr;
  if (status == nullptr || !status->is_object() || !status->contains("allocatable")) return 0;
  const KubeClient::Json& a = (*status)["allocatable"];
  if (!a.is_object() || !a.contains(resource)) return 0;
  int64_t n = 0;
  if (!a[resource].is_string() || !absl::SimpleAtoi(a[resource].get<std::string>(), &n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": status.allocatable[\"", resource, "\"] is not a whole number: ", a[resource].dump()));
  }
  return n;
}

void MoveFence::CheckStaleTaint(KubeClient* client) {
  // A taint no move of this process put there: an earlier dpproxy
  // stopped in the middle of a move. LowerWhenIdle lowers it once nothing
  // is under way here.
  absl::StatusOr<KubeClient::Json> node = client->Get(absl::StrCat("/api/v1/nodes/", node_));
  if (node.ok() || node.status().code() == absl::StatusCode::kNotFound) {
    checked_stale_ = true;
    if (node.ok() && node->is_object()) {
      const KubeClient::Json taints =
          node->value("/spec/taints"_json_pointer, KubeClient::Json::array());
      for (const KubeClient::Json& t : taints.is_array() ? taints : KubeClient::Json::array()) {
        if (t.is_object() && t.value("key", "") == kMoveTaintKey) {
          LOG(WARNING) << "DRA: node " << node_ << " has the taint " << kMoveTaintKey
                       << " of a move an earlier dpproxy did not finish; it is lowered once no "
                          "move of this one is under way";
          raised_ = true;
        }
      }
    }
  }
}

void MoveFence::Raise(KubeClient* client, std::vector<std::string>* fresh) {
  absl::Status fenced = client == nullptr
                            ? absl::UnavailableError("the API server has not answered yet")
                            : SetTaint(client, true).status();
  if (fenced.ok()) {
    raised_ = true;
    last_error_.clear();
    LOG(INFO) << "DRA: node " << node_ << " tainted " << kMoveTaintKey
              << ":NoSchedule while " << absl::StrJoin(*fresh, ", ")
              << " leave(s) the device manager: no new pod is scheduled to it until its "
                 "status shows the move";
    events_->Emit("move_fence_raised", {{"node", node_}, {"resources", *fresh}});
  } else {
    // Not fenced: withdrawn at once, as without a fence.
    const std::string why(fenced.message());
    if (why != last_error_) {
      const char* hint =
          fenced.code() == absl::StatusCode::kPermissionDenied
              ? " (give dpproxy `update` on nodes, as deploy/dra-rbac.yaml does)"
          : fenced.code() == absl::StatusCode::kNotFound
              ? " (the API server has no node of that name: check dra.node_name)"
              : "";
      LOG(WARNING) << "DRA: cannot taint node " << node_ << " while "
                   << absl::StrJoin(*fresh, ", ") << " leave(s) the device manager (" << why
                   << "); withdrawn at once: a pod the scheduler routes to the device plugin "
                      "before the node's status shows it is refused by the kubelet"
                   << hint;
      last_error_ = why;
    }
    events_->Emit("move_fence_failed", {{"node", node_}, {"resources", *fresh}, {"error", why}});
    absl::MutexLock lock(&mu_);
    for (const std::string& name : *fresh) {
      auto it = moves_.find(name);
      if (it == moves_.end() || it->second.stage != Move::kNew) continue;
      it->second.withdraw();
      moves_.erase(it);
    }
    fresh->clear();
  }
}

void MoveFence::Advance(absl::Time now, const std::vector<std::string>& fresh,
                        const std::vector<std::string>& settled) {
  absl::MutexLock lock(&mu_);
  for (const std::string& name : fresh) {
    auto it = moves_.find(name);
    if (it == moves_.end() || it->second.stage != Move::kNew) continue;
    it->second.stage = Move::kSettling;
    it->second.since = now;
  }
  // Under mu_: a Cancel (the resource moving back) either comes first
  // and the withdrawal never runs, or comes after it and serves it again.
  for (const std::string& name : settled) {
    auto it = moves_.find(name);
    if (it == moves_.end() || it->second.stage != Move::kSettling) continue;
    it->second.withdraw();
    it->second.withdraw = nullptr;
    it->second.stage = Move::kWithdrawn;
    it->second.since = now;
  }
}

void MoveFence::FinishWithdrawn(KubeClient* client, absl::Time now,
                                const std::vector<std::string>& withdrawn) {
  for (const std::string& name : withdrawn) {
    absl::StatusOr<int64_t> shown = StatusAllocatable(client, name);
    bool done = false;
    absl::Time since;
    {
      absl::MutexLock lock(&mu_);
      auto it = moves_.find(name);
      if (it == moves_.end()) continue;
      since = it->second.since;
    }
    if (shown.ok() && *shown == 0) {
      LOG(INFO) << "DRA: node " << node_ << "'s status shows " << name
                << " at 0: the scheduler routes its pods through DRA";
      done = true;
    } else if (now - since >= kStatusLimit) {
      LOG(WARNING) << "DRA: node " << node_ << "'s status still shows " << name << " ("
                   << (shown.ok() ? absl::StrCat(*shown, " allocatable")
                                  : std::string(shown.status().message()))
                   << ") " << absl::FormatDuration(kStatusLimit)
                   << " after its withdrawal; the node is scheduled to again";
      done = true;
    }
    if (done) {
      absl::MutexLock lock(&mu_);
      auto it = moves_.find(name);
      if (it != moves_.end() && it->second.stage == Move::kWithdrawn) moves_.erase(it);
    }
  }
}

void MoveFence::LowerWhenIdle(KubeClient* client) {
  bool idle;
  {
    absl::MutexLock lock(&mu_);
    idle = moves_.empty();
  }
  if (idle && raised_ && client != nullptr) {
    absl::StatusOr<bool> lowered = SetTaint(client, false);
    if (lowered.ok()) {
      raised_ = false;
      last_error_.clear();
      LOG(INFO) << "DRA: node " << node_ << " taint " << kMoveTaintKey << " removed";
      events_->Emit("move_fence_lowered", {{"node", node_}});
    } else if (std::string(lowered.status().message()) != last_error_) {
      last_error_ = std::string(lowered.status().message());
      LOG(WARNING) << "DRA: cannot remove taint " << kMoveTaintKey << " from node " << node_
                   << " (retried each second): " << last_error_;
    }
  }
}

void MoveFence::Step(absl::Time now) {
  absl::MutexLock step(&step_mu_);
  KubeClient* client;
  std::vector<std::string> fresh, settled, withdrawn;
  {
    absl::MutexLock lock(&mu_);
    client = client_;
    for (const auto& [name, m] : moves_) {
      if (m.stage == Move::kNew) fresh.push_back(name);
      if (m.stage == Move::kSettling && now - m.since >= kSettle) settled.push_back(name);
      if (m.stage == Move::kWithdrawn) withdrawn.push_back(name);
    }
  }
  if (client != nullptr && !checked_stale_) CheckStaleTaint(client);
  if (!fresh.empty() && !raised_) Raise(client, &fresh);
  Advance(now, fresh, settled);
  if (client != nullptr) FinishWithdrawn(client, now, withdrawn);
  LowerWhenIdle(client);
}

void MoveFence::Stop(KubeClient* client) {
  absl::MutexLock step(&step_mu_);
  {
    absl::MutexLock lock(&mu_);
    moves_.clear();
  }
  if (!raised_ || client == nullptr) return;
  absl::StatusOr<bool> lowered = SetTaint(client, false);
  if (lowered.ok()) {
    raised_ = false;
    events_->Emit("move_fence_lowered", {{"node", node_}});
  } else {
    LOG(WARNING) << "DRA: cannot remove taint " << kMoveTaintKey << " from node " << node_
                 << " while stopping (the next start removes it): " << lowered.status().message();
  }
}

}  // namespace dpproxy
