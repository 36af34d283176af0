#include "proxy/core/flap_damper.h"

#include <algorithm>

namespace dpproxy {

FlapDamper::Changes FlapDamper::SetSettings(const FlapDamping& settings, absl::Time now) {
  settings_ = settings;
  Changes out;
  if (on()) return out;
  for (auto& [id, d] : devices_) {
    if (d.held_until > now) out.ended.push_back({id, static_cast<int>(d.turns.size()), now - d.held_since});
  }
  devices_.clear();
  started_ = {};
  return out;
}

void FlapDamper::Observe(absl::string_view device, bool healthy, absl::Time now) {
  if (!on()) return;
  auto it = devices_.find(device);
  if (it == devices_.end()) {
    // First sight: its health is where it starts, not a turn.
    it = devices_.emplace(std::string(device), Device{}).first;
    it->second.healthy = healthy;
    return;
  }
  Device& d = it->second;
  const bool turned = d.healthy && !healthy;
  d.healthy = healthy;
  if (!turned) return;
  d.turns.push_back(now);
  while (!d.turns.empty() && d.turns.front() <= now - settings_.window) d.turns.pop_front();
  if (d.held_until > now) {
    // A turn while held: the hold doubles, from now.
    d.hold = std::min(d.hold * 2, settings_.max_backoff);
    d.held_until = now + d.hold;
    return;
  }
  if (static_cast<int>(d.turns.size()) <= settings_.flaps) return;
  d.hold = settings_.backoff;
  d.held_since = now;
  d.held_until = now + d.hold;
  started_.started.push_back({std::string(device), static_cast<int>(d.turns.size()), d.hold});
}

FlapDamper::Changes FlapDamper::Tick(absl::Time now) {
  Changes out;
  if (!on()) return out;
  for (auto it = devices_.begin(); it != devices_.end();) {
    Device& d = it->second;
    if (d.turns.empty() && d.held_until == absl::InfinitePast()) {
      ++it;  // nothing to age
      continue;
    }
    if (d.held_until != absl::InfinitePast() && d.held_until <= now) {
      out.ended.push_back({it->first, static_cast<int>(d.turns.size()), now - d.held_since});
      d.held_until = absl::InfinitePast();
    }
    while (!d.turns.empty() && d.turns.front() <= now - settings_.window) d.turns.pop_front();
    ++it;
  }
  return out;
}

FlapDamper::Changes FlapDamper::TakeStarted() {
  Changes out = std::move(started_);
  started_ = {};
  return out;
}

bool FlapDamper::damped(absl::string_view device) const {
  auto it = devices_.find(device);
  return it != devices_.end() && it->second.held_until != absl::InfinitePast();
}

std::set<std::string> FlapDamper::Damped() const {
  std::set<std::string> out;
  for (const auto& [id, d] : devices_) {
    if (d.held_until != absl::InfinitePast()) out.insert(id);
  }
  return out;
}

absl::Time FlapDamper::next_release() const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [id, d] : devices_) {
    if (d.held_until != absl::InfinitePast()) next = std::min(next, d.held_until);
  }
  return next;
}

}  // namespace dpproxy
