#include "proxy/server/static_backends.h"

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/connect.h"
#include "proxy/util/files.h"

namespace dpproxy {

namespace {

// How long a dial of a static backend may take; it is tried every tick.
constexpr absl::Duration kDialTimeout = absl::Milliseconds(500);
// A failing dial is logged this often.
constexpr absl::Duration kLogEvery = absl::Minutes(1);

}  // namespace

void StaticBackends::Dial(const std::string& name, const StaticBackendConfig& config) {
  absl::MutexLock lock(&mu_);
  Dialled& d = by_name_[name];
  d.config = config;
  d.dialled = true;
  d.removed = false;
}

bool StaticBackends::Remove(const std::string& name, const StaticBackendConfig& config) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end() || it->second.config.endpoint != config.endpoint) return false;
  it->second.dialled = false;
  it->second.removed = true;
  return true;
}

bool StaticBackends::Move(const std::string& from, const std::string& to) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(from);
  if (it == by_name_.end() || !it->second.dialled) return false;
  it->second.dialled = false;
  Dialled& d = by_name_[to];
  d.config = it->second.config;
  d.dialled = true;
  d.removed = false;
  return true;
}

void StaticBackends::PluginServes(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it != by_name_.end()) it->second.removed = false;
}

void StaticBackends::MarkRemoved(const std::string& name) {
  absl::MutexLock lock(&mu_);
  by_name_[name].removed = true;
}

bool StaticBackends::dialled(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  return it != by_name_.end() && it->second.dialled;
}

StaticBackends::Report StaticBackends::report(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return Report();
  const Dialled& d = it->second;
  Report r;
  r.dialled = d.dialled;
  r.removed = d.removed;
  if (d.dialled) {
    r.error = d.error;
    r.failures = d.failures;
  }
  return r;
}

std::set<std::string> StaticBackends::removed() {
  std::set<std::string> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, d] : by_name_) {
    if (d.removed) out.insert(name);
  }
  return out;
}

void StaticBackends::AppendFingerprint(std::string* out) {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, d] : by_name_) {
    absl::StrAppend(out, name, "|", d.dialled, "|", d.removed, "|", d.error, "|");
  }
}

void StaticBackends::Tick(const std::vector<ServedResource*>& served) {
  for (ServedResource* e : served) {
    const std::string& name = e->resource->name();
    {
      absl::MutexLock lock(&mu_);
      auto it = by_name_.find(name);
      if (it == by_name_.end() || !it->second.dialled || it->second.connecting) continue;
      // A silent one is still attached: the watchdog sees it answer again.
      if (e->resource->backend_connected() || e->resource->backend_silent()) continue;
      it->second.connecting = true;
    }
    const bool queued = workers_->Submit([this, name] {
      Connect(name);
      absl::MutexLock lock(&mu_);
      by_name_[name].connecting = false;
    });
    if (!queued) {
      absl::MutexLock lock(&mu_);
      by_name_[name].connecting = false;
    }
  }
}

void StaticBackends::Connect(const std::string& name) {
  StaticBackendConfig sb;
  {
    absl::MutexLock lock(&mu_);
    sb = by_name_[name].config;
  }
  // A plugin that is not running is said so at once. A dial would hold this
  // worker in gRPC's wait for a connection for all of kDialTimeout, and a
  // thread waiting there polls gRPC's sockets for the whole process: under
  // load it woke at every Allocate of every other resource.
  if (!SomeoneListens(sb.endpoint)) {
    return Note(name, sb,
                absl::UnavailableError(absl::StrCat("nobody listens on ", sb.endpoint,
                                                    " (the plugin is not running)")));
  }
  absl::StatusOr<ApiVersion> api = sb.api ? absl::StatusOr<ApiVersion>(*sb.api)
                                          : ProbeBackendApi(sb.endpoint, kDialTimeout);
  if (!api.ok()) return Note(name, sb, api.status());
  absl::StatusOr<std::shared_ptr<Backend>> b =
      ConnectBackend(sb.resource, sb.endpoint, *api, kDialTimeout, options_.max_list_bytes);
  Note(name, sb, b.status());
  if (!b.ok()) return;
  if (!dialled(name)) {  // a reload dropped it meanwhile
    (*b)->Stop();
    return;
  }
  (void)attach_(*b);
}

void StaticBackends::Note(const std::string& name, const StaticBackendConfig& sb,
                          const absl::Status& s) {
  int64_t failures;
  bool log;
  {
    absl::MutexLock lock(&mu_);
    Dialled& d = by_name_[name];
    if (s.ok()) {
      failures = d.failures;
      d.failures = 0;
      d.error.clear();
      d.logged_at = absl::InfinitePast();
      log = failures > 0;
    } else {
      failures = ++d.failures;
      d.error = std::string(s.message());
      const absl::Time now = absl::Now();
      log = now - d.logged_at >= kLogEvery;
      if (log) d.logged_at = now;
    }
  }
  dials_.Add();
  if (!log) return;
  if (s.ok()) {
    LOG(INFO) << "static backend " << sb.endpoint << " of " << sb.resource << " dialled after "
              << failures << " failed attempt(s)";
    return;
  }
  LOG(WARNING) << "static backend " << sb.endpoint << " of " << sb.resource
               << " cannot be dialled: " << s.message() << " (" << failures
               << " attempt(s); tried again every second, logged once a minute)";
  if (failures == 1) {
    events_->Emit("static_backend_unreachable", {{"resource", sb.resource},
                                                 {"endpoint", sb.endpoint},
                                                 {"error", std::string(s.message())}});
  }
}

}  // namespace dpproxy
