#include "proxy/server/reloader.h"

#include <set>

#include <glog/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "proxy/config/config_file.h"

namespace dpproxy {
namespace {

std::string Line(const SettingChange& c) {
  return absl::StrCat(c.path, ": ", c.from.empty() ? "(none)" : c.from, " -> ",
                      c.to.empty() ? "(none)" : c.to);
}

// A static backend as a reload compares them: resource, socket and API.
std::string Key(const StaticBackendConfig& b) {
  return absl::StrCat(b.resource, "\n", b.endpoint, "\n",
                      b.api ? ApiWireVersion(*b.api) : absl::string_view("auto"));
}

}  // namespace

Reloader::Result Reloader::Reload(const ProxyConfig& running, const ProxyConfig& next) {
  Result result;
  bool backends = false, loss = false, calls = false, names = false, paths = false;
  for (const SettingChange& c : ChangedSettings(running, next)) {
    bool* kind = nullptr;
    if ((absl::StartsWith(c.path, "renames.") || absl::StartsWith(c.path, "id_maps.") ||
         absl::StartsWith(c.path, "compact_ids[")) &&
        !dra_) {
      kind = &names;
    } else if (absl::StartsWith(c.path, "paths.") && both_sides_) {
      kind = &paths;
    } else if (absl::StartsWith(c.path, "backends[")) {
      kind = &backends;
    } else if (absl::StartsWith(c.path, "backend_loss.") ||
               absl::StartsWith(c.path, "backend_probe.") ||
               absl::StartsWith(c.path, "flap_damping.")) {
      kind = &loss;
    } else if (c.path == "timeouts.backend" || c.path == "timeouts.dial" ||
               c.path == "cdi_annotations") {
      kind = &calls;
    }
    if (kind == nullptr) {
      result.needs_restart.push_back(Line(c));
      continue;
    }
    *kind = true;
    result.applied.push_back(Line(c));
  }
  if (loss) {
    host_->ApplyLossPolicy(next);
    events_->Emit("config_applied",
                  {{"setting", "backend_loss"},
                   {"policy", next.policy.loss_policy == LossPolicy::kHold ? "hold" : "unhealthy"},
                   {"hold", absl::FormatDuration(next.policy.hold)},
                   {"grace", absl::FormatDuration(next.policy.grace)},
                   {"probe_interval", absl::FormatDuration(next.policy.probe.interval)},
                   {"probe_timeout", absl::FormatDuration(next.policy.probe.timeout)},
                   {"probe_misses", next.policy.probe.misses},
                   {"flap_damping_flaps", next.policy.flap_damping.flaps}});
  }
  if (calls) {
    // From the next call on; calls under way keep the limit they began with.
    host_->ApplyCallSettings(next);
    events_->Emit("config_applied",
                  {{"setting", "calls"},
                   {"backend_timeout", absl::FormatDuration(next.kubelet.backend_timeout)},
                   {"dial_timeout", absl::FormatDuration(next.dial_timeout)},
                   {"cdi_annotations", next.kubelet.cdi_annotations}});
  }
  if (names) host_->ApplyServedNames(next);
  if (paths) host_->ApplyPaths(next);
  if (backends) ApplyStaticBackends(running, next);
  for (const std::string& l : result.applied) LOG(INFO) << "reload applied " << l;
  for (const std::string& l : result.needs_restart) {
    LOG(WARNING) << "reload: " << l << " takes effect at the next start";
  }
  events_->Emit("config_reloaded", {{"applied", result.applied},
                                    {"needs_restart", result.needs_restart}});
  return result;
}

void Reloader::ApplyStaticBackends(const ProxyConfig& running, const ProxyConfig& next) {
  std::set<std::string> before, after;
  for (const StaticBackendConfig& b : running.static_backends) before.insert(Key(b));
  for (const StaticBackendConfig& b : next.static_backends) after.insert(Key(b));
  // Dropped first: a backend moved to another socket is dialled there next.
  for (const StaticBackendConfig& b : running.static_backends) {
    if (after.count(Key(b)) == 0) host_->RemoveStaticBackend(b);
  }
  for (const StaticBackendConfig& b : next.static_backends) {
    if (before.count(Key(b)) == 0) host_->AddStaticBackend(b);
  }
  host_->StaticBackendsApplied(next);
}

}  // namespace dpproxy
