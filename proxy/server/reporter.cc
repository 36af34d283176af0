#include "proxy/server/reporter.h"

#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/util/files.h"

namespace dpproxy {

namespace {

// The registrar's readiness check of one resource: "registered:NAME".
constexpr char kRegisteredCheck[] = "registered:";

}  // namespace

ProxyStatus Reporter::Status(bool with_devices) {
  if (with_devices) ++status_builds_;
  ProxyStatus st;
  st.pid = ::getpid();
  const ProxyConfig& config = *p_.config;
  if (p_.dra) {
    st.dra = DraStatus{config.dra.driver,          config.dra.node_name,
                       p_.dra->api_version(),      p_.dra->registration_socket(),
                       p_.dra->registered(),       p_.dra->api_error(),
                       p_.dra->prepared_claims()};
  }
  st.kubelet_root = config.kubelet.kubelet_root;
  st.plugin_socket = JoinPath(config.plugin_dir, kKubeletSocketName);
  const std::map<std::string, StateKeeper::HeldAcross> held =
      p_.keeper ? p_.keeper->HeldAcrossPaths() : std::map<std::string, StateKeeper::HeldAcross>();
  for (ServedResource* e : p_.table->All()) {
    st.resources.push_back(ResourceStatusOf(e, with_devices));
    ResourceStatus& r = st.resources.back();
    r.path = KubeletPathName(p_.table->PathOf(r.resource));
    if (auto h = held.find(r.resource); h != held.end()) {
      r.devices_held_by_claims = static_cast<int64_t>(h->second.by_claims.size());
      r.devices_held_by_pods = static_cast<int64_t>(h->second.by_pods.size());
    }
  }
  st.lossy_translations = p_.losses->Snapshot();
  if (p_.keeper) st.state = StateStatusOf();
  if (p_.withheld) {
    Withheld::Rows rows = p_.withheld->rows();
    st.forgotten = std::move(rows.forgotten);
    st.held_elsewhere = std::move(rows.held_elsewhere);
    st.cordoned = std::move(rows.cordoned);
    for (ResourceStatus& r : st.resources) {
      auto it = rows.renamed.find(r.resource);
      if (it != rows.renamed.end()) r.now_served_as = it->second;
    }
  }
  if (p_.reconciler) {
    st.devices_held_twice = p_.reconciler->forgotten()->devices_held_twice();
    st.forgotten_released = p_.reconciler->forgotten()->released();
    st.allocations_recovered = p_.reconciler->allocations_recovered();
    st.allocations_recovered_by_source = p_.reconciler->allocations_recovered_by_source();
    st.allocations_unrecoverable = p_.reconciler->allocations_unrecoverable();
  }
  if (p_.registration) st.registrations_rejected = p_.registration->Rejections();
  std::set<std::string> unregistered;
  for (HealthCheck& c : Readiness()) {
    if (c.ok) continue;
    if (absl::StartsWith(c.name, kRegisteredCheck)) {
      unregistered.insert(c.name.substr(strlen(kRegisteredCheck)));
    }
    st.not_ready.push_back(std::move(c));
  }
  for (ResourceStatus& r : st.resources) {
    r.kubelet_registered = !r.kubelet_api.empty() && unregistered.count(r.resource) == 0;
  }
  return st;
}

ResourceStatus Reporter::ResourceStatusOf(ServedResource* e, bool with_devices) {
  const Resource::Snapshot snap = e->resource->Current();
  const v1beta1::DevicePluginOptions opts = e->resource->options();
  const Resource::LastBackend last = e->resource->last_backend();
  const std::string& endpoint = last.endpoint;
  const std::string& backend_api = last.api;
  ResourceStatus r;
  r.resource = e->resource->name();
  const KubeletView kubelet = p_.side->ViewOf(r.resource);
  r.kubelet_api = kubelet.api;
  r.kubelet_socket = kubelet.socket;
  r.backend_connected = e->resource->backend_connected();
  r.backend_silent = e->resource->backend_silent();
  r.backend_api = backend_api;
  r.backend_endpoint = endpoint;
  // From the static backends, not from the last withheld pass: a reload
  // that removed one shows at once.
  const StaticBackends::Report statics = p_.statics->report(r.resource);
  r.static_backend = statics.dialled;
  r.removed = statics.removed;
  r.backend_error = statics.error;
  r.backend_dial_failures = statics.failures;
  r.pre_start_required = opts.pre_start_required();
  r.get_preferred_allocation_available = opts.get_preferred_allocation_available();
  r.devices_total = snap.list->size();
  r.devices_healthy = snap.list->healthy();
  r.device_list_bytes = static_cast<int64_t>(snap.list->bytes());
  r.device_list_too_large = snap.list->bytes() > kKubeletMaxListBytes;
  r.device_list_refused = e->resource->list_refused();
  r.device_ids_mapped = e->resource->ids_mapped();
  r.compact_ids = e->resource->compact_ids_mode();
  r.forgotten_avoided = kubelet.forgotten_avoided;
  r.forgotten_named = kubelet.forgotten_named;
  r.forgotten_refused = e->allocator->refused_held();
  if (with_devices) r.device_list = snap.list;  // shared, not copied
  return r;
}

StateStatus Reporter::StateStatusOf() {
  StateKeeper* k = p_.keeper;
  StateStatus s;
  s.path = k->path();
  s.allocations = k->AllocationCount();
  s.save_failures = k->save_failures();
  s.writable = k->writable();
  if (!s.writable) s.last_write_error = k->last_write_error();
  s.journal_writes = k->journal_writes();
  s.journal_records = k->journal_records();
  s.compactions = k->compactions();
  s.journal_bytes = k->journal_bytes();
  s.snapshot_bytes = k->snapshot_bytes();
  return s;
}

std::string Reporter::Fingerprint() {
  std::string fp;
  for (const auto& [e, facts] : p_.table->AllWithFacts()) {
    const KubeletView kubelet = p_.side->ViewOf(e->resource->name());
    absl::StrAppend(&fp, e->resource->name(), "|", facts.restored_kubelet_api, "|",
                    e->resource->changes(), "|", kubelet.api, "|", kubelet.forgotten_avoided,
                    "|", kubelet.forgotten_named, "|", e->allocator->refused_held(), "|");
  }
  p_.statics->AppendFingerprint(&fp);
  // The rows derived from the keeper's state (forgotten, held elsewhere),
  // as last applied: the status is written again once they are.
  if (p_.withheld) absl::StrAppend(&fp, p_.withheld->rows_version(), "|");
  if (p_.reconciler) {
    absl::StrAppend(&fp, p_.reconciler->forgotten()->devices_held_twice(), "|",
                    p_.reconciler->forgotten()->released(), "|",
                    p_.reconciler->allocations_recovered(), "|",
                    p_.reconciler->allocations_unrecoverable(), "|");
  }
  absl::StrAppend(&fp, p_.losses->Total(), "|");
  // Why each check fails, without its figures: a retry's countdown must
  // not rewrite the status file every second.
  for (const HealthCheck& c : Readiness()) {
    if (c.ok) continue;
    std::string reason = c.reason;
    reason.erase(std::remove_if(reason.begin(), reason.end(),
                                [](char ch) { return ch >= '0' && ch <= '9'; }),
                 reason.end());
    absl::StrAppend(&fp, c.name, ":", reason, "|");
  }
  if (p_.dra) {
    absl::StrAppend(&fp, p_.dra->registered(), "|", p_.dra->api_version(), "|",
                    p_.dra->api_error(), "|", p_.dra->prepared_claims(), "|");
  }
  if (p_.keeper) {
    absl::StrAppend(&fp, p_.keeper->AllocationCount(), "|", p_.keeper->save_failures(), "|",
                    p_.keeper->writable(), "|", p_.keeper->quarantine_version());
  }
  return fp;
}

std::vector<StateKeeper::ResourceToSave> Reporter::SavedResources() {
  std::vector<StateKeeper::ResourceToSave> out;
  for (const auto& [e, facts] : p_.table->AllWithFacts()) {
    state::Resource r;
    r.set_name(e->resource->name());
    const std::string api = p_.side->ViewOf(e->resource->name()).api;
    r.set_kubelet_api(api.empty() ? facts.restored_kubelet_api : api);
    r.set_compact_ids(e->resource->compact_ids_mode() == "on by itself");
    const Resource::LastBackend last = e->resource->last_backend();
    r.mutable_backend()->set_endpoint(last.endpoint);
    r.mutable_backend()->set_api_version(last.api);
    if (last.options.has_value()) *r.mutable_backend()->mutable_options() = *last.options;
    r.mutable_backend()->set_backend_resource(facts.backend_resource);
    // A removed one too: the next start knows it is no longer wanted.
    const StaticBackends::Report statics = p_.statics->report(r.name());
    r.mutable_backend()->set_static_backend(statics.dialled || statics.removed);
    out.push_back({r.SerializeAsString(), e->resource->ReportedDevices()->shared_wire()});
  }
  return out;
}

std::vector<HealthCheck> Reporter::Readiness() {
  std::vector<HealthCheck> checks = p_.side->Readiness();
  // A resource restored from the state file with no plugin connected since:
  // the kubelet is shown its remembered devices, Healthy where they were,
  // on trust alone; or its plugin is being dialled again.
  const std::map<std::string, Redialer::Report> redials =
      p_.redialer ? p_.redialer->reports() : std::map<std::string, Redialer::Report>();
  for (ServedResource* e : p_.table->All()) {
    const std::string& name = e->resource->name();
    if (e->resource->backend_connected()) continue;
    if (e->resource->backend_silent()) {
      checks.push_back(
          {absl::StrCat("backend:", name), false,
           absl::StrCat("its plugin at ", e->resource->last_backend().endpoint,
                        " holds its stream open but answers no call (the watchdog's asks); "
                        "its devices are shown as the loss policy says until it answers")});
      continue;
    }
    auto redial = redials.find(name);
    const std::optional<absl::Time> trusted = e->resource->trusted_until();
    if (redial != redials.end() && redial->second.outcome == Redialer::Outcome::kDialling) {
      checks.push_back({absl::StrCat("backend:", name), false,
                        absl::StrCat("dialling again the plugin that served it before this "
                                     "dpproxy started, at ", redial->second.endpoint)});
    } else if (trusted.has_value()) {
      std::string why = absl::StrCat(
          "no plugin has connected since dpproxy started; ", e->resource->ShownWhileAway());
      if (redial != redials.end() && !redial->second.error.empty()) {
        absl::StrAppend(&why, " (its plugin at ", redial->second.endpoint,
                        " was dialled again: ", redial->second.error, ")");
      }
      checks.push_back({absl::StrCat("backend:", name), false, std::move(why)});
    }
  }
  // A resource whose plugin's last list was refused: named until a list
  // is taken.
  for (ServedResource* e : p_.table->All()) {
    std::string refused = e->resource->list_refused();
    if (refused.empty()) continue;
    checks.push_back({absl::StrCat("device-list:", e->resource->name()), false,
                      absl::StrCat("the plugin's device list was refused: ", refused)});
  }
  // Devices cordoned by hand: the node is ready, and /readyz?verbose says
  // which are out of service.
  if (p_.withheld) {
    std::map<std::string, std::vector<std::string>> cordoned;
    for (const CordonStatus& c : p_.withheld->rows().cordoned) {
      cordoned[c.resource].push_back(absl::StrCat(c.device, " (", c.reason, ")"));
    }
    for (const auto& [resource, devices] : cordoned) {
      checks.push_back({absl::StrCat("cordoned:", resource), true,
                        absl::StrCat(devices.size(), " device(s) cordoned: ",
                                     absl::StrJoin(devices, ", "))});
    }
  }
  if (p_.keeper) {
    HealthCheck c;
    c.name = "state-writable";
    c.ok = p_.keeper->writable();
    if (!c.ok) {
      c.reason = absl::StrCat("the last write to ", p_.keeper->path(), " failed: ",
                              p_.keeper->last_write_error(),
                              "; an Allocate is refused when its journal record cannot be written");
    }
    checks.push_back(std::move(c));
  }
  return checks;
}

}  // namespace dpproxy
