#include "proxy/server/metrics.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include <prometheus/text_serializer.h>

#include "proxy/version/version.h"


namespace dpproxy {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(const std::string& name, const std::string& help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void AddGauge(MetricFamily* f, std::vector<ClientMetric::Label> labels, double v) {
  ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = v;
  f->metric.push_back(std::move(m));
}

void AddCounter(MetricFamily* f, std::vector<ClientMetric::Label> labels, double v) {
  ClientMetric m;
  m.label = std::move(labels);
  m.counter.value = v;
  f->metric.push_back(std::move(m));
}

// The process_* families Prometheus' own clients export, from /proc/self:
// CPU seconds, resident and virtual memory, open and allowed descriptors,
// the start time. A value /proc does not give is left out.
void AppendProcessFamilies(std::vector<MetricFamily>* out) {
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // Fields after the command name, which is in parentheses and may hold
  // spaces: [0] is field 3 (state) of proc(5).
  std::vector<std::string> f;
  const size_t paren = stat.rfind(')');
  if (paren != std::string::npos) {
    std::istringstream rest(stat.substr(paren + 1));
    for (std::string v; rest >> v;) f.push_back(v);
  }
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  auto field = [&f](size_t proc_field) {
    return proc_field - 3 < f.size() ? std::strtod(f[proc_field - 3].c_str(), nullptr) : -1.0;
  };
  auto gauge = [out](const char* name, const char* help, double v, MetricType type) {
    if (v < 0) return;
    MetricFamily fam = Family(name, help, type);
    if (type == MetricType::Counter) {
      AddCounter(&fam, {}, v);
    } else {
      AddGauge(&fam, {}, v);
    }
    out->push_back(std::move(fam));
  };
  if (ticks > 0 && f.size() > 21) {
    gauge("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
          (field(14) + field(15)) / ticks, MetricType::Counter);
    gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", field(23),
          MetricType::Gauge);
    gauge("process_resident_memory_bytes", "Resident memory size in bytes.", field(24) * page,
          MetricType::Gauge);
    // Its start, in ticks after boot, and the boot time from /proc/stat.
    std::ifstream boot("/proc/stat");
    for (std::string line; std::getline(boot, line);) {
      if (line.rfind("btime ", 0) != 0) continue;
      gauge("process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            std::strtod(line.c_str() + 6, nullptr) + field(22) / ticks, MetricType::Gauge);
    }
  }
  if (DIR* d = ::opendir("/proc/self/fd"); d != nullptr) {
    int fds = 0;
    while (const dirent* e = ::readdir(d)) fds += e->d_name[0] != '.';
    ::closedir(d);
    gauge("process_open_fds", "Number of open file descriptors.", fds - 1,  // the one read here
          MetricType::Gauge);
  }
  if (rlimit r; ::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
    gauge("process_max_fds", "Maximum number of open file descriptors.",
          static_cast<double>(r.rlim_cur), MetricType::Gauge);
  }
}

}  // namespace

bool IsLoopbackAddress(const std::string& host_port) {
  std::string host = host_port;
  const size_t colon = host_port.rfind(':');
  if (colon != std::string::npos && host_port.find(']') == std::string::npos &&
      host_port.find(':') == colon) {
    host = host_port.substr(0, colon);  // host:port
  } else if (!host_port.empty() && host_port[0] == '[') {
    const size_t close = host_port.find(']');
    host = host_port.substr(1, close == std::string::npos ? std::string::npos : close - 1);
  }
  if (host == "localhost") return true;
  struct in_addr v4;
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  struct in6_addr v6;
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

namespace {

// Counters kept by the event log, each a family of its own, labelled only
// with resources dpproxy serves (a name from a refused registration never
// becomes a label).
void AppendEventCounters(const ProxyStatus& status,
                         const std::map<std::pair<std::string, std::string>, int64_t>& counts,
                         std::vector<MetricFamily>* out) {
  std::set<std::string> served;
  for (const ResourceStatus& r : status.resources) served.insert(r.resource);
  struct Named {
    const char* event;
    const char* family;
    const char* help;
    const char* result;  // the result label's value, or null for none
  };
  static constexpr Named kNamed[] = {
      {"kubelet_registered", "dpproxy_kubelet_registrations_total",
       "Registrations with the kubelet, by resource and result (ok, failed).", "ok"},
      {"kubelet_registration_failed", "dpproxy_kubelet_registrations_total", nullptr, "failed"},
      {"kubelet_restart_detected", "dpproxy_kubelet_restarts_detected_total",
       "Kubelet restarts dpproxy noticed (a new kubelet.sock), by resource registered again.",
       nullptr},
      {"backend_up", "dpproxy_backend_connects_total",
       "Backends (vendor plugins) that connected, by resource.", nullptr},
      {"backend_down", "dpproxy_backend_losses_total",
       "Backend streams that ended (plugin gone or restarted), by resource.", nullptr},
      {"backend_silent", "dpproxy_backend_silences_total",
       "Backends that held their stream open but answered none of the watchdog's last asks "
       "(treated as lost until they answer), by resource.",
       nullptr},
      {"device_flapping", "dpproxy_device_flap_episodes_total",
       "Episodes of a device held Unhealthy because its health flapped (flap_damping), by "
       "resource.",
       nullptr},
      {"device_list_refused", "dpproxy_device_lists_refused_total",
       "Device lists from a backend that dpproxy refused (bad IDs), by resource.", nullptr},
      {"dra_pool_published", "dpproxy_dra_pool_writes_total",
       "DRA mode: times a resource's pool was written to the API server (it changed, or "
       "its slices were gone), by resource and result (ok, failed).",
       "ok"},
      {"dra_publish_failed", "dpproxy_dra_pool_writes_total", nullptr, "failed"},
  };
  std::map<std::string, MetricFamily> families;
  for (const Named& n : kNamed) {
    auto [it, fresh] = families.try_emplace(n.family);
    if (fresh) it->second = Family(n.family, n.help != nullptr ? n.help : "", MetricType::Counter);
    for (const std::string& res : served) {
      auto c = counts.find({n.event, res});
      const double v = c == counts.end() ? 0 : static_cast<double>(c->second);
      std::vector<ClientMetric::Label> labels = {{"resource", res}};
      if (n.result != nullptr) labels.push_back({"result", n.result});
      AddCounter(&it->second, std::move(labels), v);
    }
  }
  for (auto& [name, f] : families) out->push_back(std::move(f));
}

// dpproxy_build_info.
void AppendBuildInfo(std::vector<MetricFamily>* out) {
  MetricFamily build = Family("dpproxy_build_info",
                              "1, labelled with dpproxy's version and the commit it was built "
                              "from.",
                              MetricType::Gauge);
  AddGauge(&build, {{"version", kDpproxyVersion}, {"commit", kDpproxyCommit}}, 1);
  out->push_back(std::move(build));
}

// DRA mode's driver: registered, the API server answering, claims prepared.
void AppendDraFamilies(const ProxyStatus& status, std::vector<MetricFamily>* out) {
  if (!status.dra.has_value()) return;
  MetricFamily registered = Family(
      "dpproxy_dra_registered", "DRA mode: 1 once the kubelet registered the driver.",
      MetricType::Gauge);
  AddGauge(&registered, {{"driver", status.dra->driver}}, status.dra->registered ? 1 : 0);
  out->push_back(std::move(registered));
  MetricFamily api = Family("dpproxy_dra_api_server_ok",
                            "DRA mode: 1 while the API server answers and every pool is "
                            "written; 0 with the reason in /readyz?verbose and the status.",
                            MetricType::Gauge);
  AddGauge(&api, {{"driver", status.dra->driver}}, status.dra->api_error.empty() ? 1 : 0);
  out->push_back(std::move(api));
  MetricFamily claims = Family("dpproxy_dra_claims_prepared",
                               "DRA mode: claims prepared and not yet unprepared.",
                               MetricType::Gauge);
  AddGauge(&claims, {{"driver", status.dra->driver}},
           static_cast<double>(status.dra->claims_prepared));
  out->push_back(std::move(claims));
}

// The families with a sample per resource served, from its status.
struct PerResourceFamily {
  const char* name;
  const char* help;
  void (*add)(MetricFamily* f, const ResourceStatus& r);
};

constexpr PerResourceFamily kPerResource[] = {
    {"dpproxy_device_list_bytes",
     "Size of the device list sent to the kubelet; the kubelet accepts at most 4194304.",
     [](MetricFamily* f, const ResourceStatus& r) {
       AddGauge(f, {{"resource", r.resource}}, static_cast<double>(r.device_list_bytes));
     }},
    {"dpproxy_device_list_refused",
     "1 while the plugin's last device list is refused (an empty ID, an ID listed twice): "
     "the kubelet keeps the list before it.",
     [](MetricFamily* f, const ResourceStatus& r) {
       AddGauge(f, {{"resource", r.resource}}, r.device_list_refused.empty() ? 0 : 1);
     }},
    {"dpproxy_static_backend_dial_failures",
     "Failed attempts in a row to dial a static backend (0 once it is reached); dpproxy "
     "tries every second.",
     [](MetricFamily* f, const ResourceStatus& r) {
       if (r.static_backend) {
         AddGauge(f, {{"resource", r.resource}}, static_cast<double>(r.backend_dial_failures));
       }
     }},
    {"dpproxy_device_ids_mapped",
     "Device IDs with control characters, shown to the kubelet as their compact IDs "
     "(compact_ids).",
     [](MetricFamily* f, const ResourceStatus& r) {
       AddGauge(f, {{"resource", r.resource}}, static_cast<double>(r.device_ids_mapped));
     }},
    {"dpproxy_devices", "Devices reported to the kubelet, by health.",
     [](MetricFamily* f, const ResourceStatus& r) {
       AddGauge(f, {{"resource", r.resource}, {"health", "healthy"}},
                static_cast<double>(r.devices_healthy));
       AddGauge(f, {{"resource", r.resource}, {"health", "unhealthy"}},
                static_cast<double>(r.devices_total - r.devices_healthy));
     }},
    {"dpproxy_backend_connected", "1 while a backend serves the resource.",
     [](MetricFamily* f, const ResourceStatus& r) {
       AddGauge(f, {{"resource", r.resource}}, r.backend_connected ? 1 : 0);
     }},
    {"dpproxy_kubelet_registered",
     "1 while registered with the kubelet that runs now (its /readyz check passes); 0 once "
     "the kubelet is away.",
     [](MetricFamily* f, const ResourceStatus& r) {
       AddGauge(f, {{"resource", r.resource}}, r.kubelet_registered ? 1 : 0);
     }},
    {"dpproxy_resource_info",
     "1, labelled with the kubelet API the resource was last registered in and its "
     "backend's API (\"\" if none yet).",
     [](MetricFamily* f, const ResourceStatus& r) {
       AddGauge(f,
                {{"resource", r.resource},
                 {"kubelet_api", r.kubelet_api},
                 {"backend_api", r.backend_api}},
                1);
     }},
};

void AppendResourceFamilies(const ProxyStatus& status, std::vector<MetricFamily>* out) {
  for (const PerResourceFamily& pf : kPerResource) {
    MetricFamily f = Family(pf.name, pf.help, MetricType::Gauge);
    for (const ResourceStatus& r : status.resources) pf.add(&f, r);
    out->push_back(std::move(f));
  }
}

// One gauge sample per resource, labelled with its name.
void AddPerResource(MetricFamily* f, const std::map<std::string, size_t>& per_resource) {
  for (const auto& [res, n] : per_resource) {
    AddGauge(f, {{"resource", res}}, static_cast<double>(n));
  }
}

// Devices the kubelet forgot, and what dpproxy did about them.
void AppendForgottenFamilies(const ProxyStatus& status, std::vector<MetricFamily>* out) {
  MetricFamily forgotten = Family(
      "dpproxy_forgotten_devices",
      "Devices still in use by containers the kubelet lost track of (it restarted without its "
      "checkpoint); new pods are steered away from them.",
      MetricType::Gauge);
  std::map<std::string, size_t> per_resource;
  for (const ForgottenStatus& q : status.forgotten) per_resource[q.resource] += q.devices.size();
  AddPerResource(&forgotten, per_resource);
  out->push_back(std::move(forgotten));
  MetricFamily steered = Family(
      "dpproxy_forgotten_devices_steered_total",
      "Forgotten devices a GetPreferredAllocation answer left out (avoided) or had to name "
      "(named: too few others were available), by resource.",
      MetricType::Counter);
  MetricFamily refused = Family(
      "dpproxy_forgotten_allocates_refused_total",
      "Allocates refused because they named a device a running container the kubelet forgot "
      "still holds, by resource.",
      MetricType::Counter);
  for (const ResourceStatus& r : status.resources) {
    AddCounter(&steered, {{"resource", r.resource}, {"outcome", "avoided"}},
               static_cast<double>(r.forgotten_avoided));
    AddCounter(&steered, {{"resource", r.resource}, {"outcome", "named"}},
               static_cast<double>(r.forgotten_named));
    AddCounter(&refused, {{"resource", r.resource}}, static_cast<double>(r.forgotten_refused));
  }
  out->push_back(std::move(steered));
  out->push_back(std::move(refused));
  MetricFamily released = Family("dpproxy_forgotten_released_total",
                                 "Forgotten allocations released because their container was "
                                 "found gone.",
                                 MetricType::Counter);
  AddCounter(&released, {}, static_cast<double>(status.forgotten_released));
  out->push_back(std::move(released));
}

// Allocations learned back after a start on a damaged state, and devices
// held under another name or twice.
void AppendRecoveryFamilies(const ProxyStatus& status, std::vector<MetricFamily>* out) {
  MetricFamily recovered = Family("dpproxy_allocations_recovered_total",
                                  "Allocations learned back from the kubelet (its checkpoint "
                                  "or its pod-resources API) after a start on a damaged state.",
                                  MetricType::Counter);
  for (const char* source : {"kubelet_checkpoint", "pod_resources"}) {
    auto it = status.allocations_recovered_by_source.find(source);
    AddCounter(&recovered, {{"source", source}},
               static_cast<double>(
                   it == status.allocations_recovered_by_source.end() ? 0 : it->second));
  }
  out->push_back(std::move(recovered));
  MetricFamily unrecoverable = Family(
      "dpproxy_allocations_unrecoverable_total",
      "Allocations the kubelet lists that a damaged state lost and that could not be learned "
      "back (some of their devices are journaled under another allocation).",
      MetricType::Counter);
  AddCounter(&unrecoverable, {}, static_cast<double>(status.allocations_unrecoverable));
  out->push_back(std::move(unrecoverable));
  MetricFamily elsewhere = Family(
      "dpproxy_devices_held_elsewhere",
      "Devices reported Unhealthy because a pod holds them under another resource name or "
      "device ID (renames, ID maps or compact IDs changed).",
      MetricType::Gauge);
  std::map<std::string, size_t> held_per_resource;
  for (const HeldElsewhereStatus& h : status.held_elsewhere) ++held_per_resource[h.resource];
  AddPerResource(&elsewhere, held_per_resource);
  out->push_back(std::move(elsewhere));
  MetricFamily cordoned = Family(
      "dpproxy_devices_cordoned",
      "Devices an operator took out of service (dpctl cordon): reported Unhealthy until "
      "uncordoned.",
      MetricType::Gauge);
  std::map<std::string, size_t> cordoned_per_resource;
  for (const ResourceStatus& r : status.resources) cordoned_per_resource[r.resource] = 0;
  for (const CordonStatus& c : status.cordoned) ++cordoned_per_resource[c.resource];
  AddPerResource(&cordoned, cordoned_per_resource);
  out->push_back(std::move(cordoned));
  MetricFamily twice = Family("dpproxy_devices_held_twice_total",
                              "Devices found allocated to a second pod while a pod the "
                              "kubelet lost track of held them.",
                              MetricType::Counter);
  AddCounter(&twice, {}, static_cast<double>(status.devices_held_twice));
  out->push_back(std::move(twice));
}

// Fields lost in translation and backend registrations refused.
void AppendTranslationFamilies(const ProxyStatus& status, std::vector<MetricFamily>* out) {
  MetricFamily losses = Family("dpproxy_lossy_translations_total",
                               "Fields dropped because the other side's API has no place for "
                               "them, by resource and kind.",
                               MetricType::Counter);
  for (const auto& [res, kinds] : status.lossy_translations) {
    for (const auto& [kind, n] : kinds) {
      AddCounter(&losses, {{"resource", res}, {"kind", kind}}, static_cast<double>(n));
    }
  }
  out->push_back(std::move(losses));

  MetricFamily rejected = Family("dpproxy_backend_registrations_rejected_total",
                                 "Backend registrations refused, by reason (version, "
                                 "resource_name, endpoint, dial, attach).",
                                 MetricType::Counter);
  for (const auto& [reason, n] : status.registrations_rejected) {
    AddCounter(&rejected, {{"reason", reason}}, static_cast<double>(n));
  }
  out->push_back(std::move(rejected));
}

// The durable state: failed saves, the journal and the snapshot.
void AppendStateFamilies(const ProxyStatus& status, std::vector<MetricFamily>* out) {
  if (!status.state) return;
  const StateStatus& s = *status.state;
  MetricFamily failures = Family("dpproxy_state_save_failures_total",
                                 "Failed writes of the state file or journal.",
                                 MetricType::Counter);
  AddCounter(&failures, {}, static_cast<double>(s.save_failures));
  out->push_back(std::move(failures));
  MetricFamily journal = Family("dpproxy_journal_allocations",
                                "Allocations in dpproxy's durable state.", MetricType::Gauge);
  AddGauge(&journal, {}, static_cast<double>(s.allocations));
  MetricFamily writes = Family(
      "dpproxy_journal_writes_total",
      "Journal writes, each one fdatasync; fewer than records when concurrent Allocates "
      "share one (group commit).",
      MetricType::Counter);
  AddCounter(&writes, {}, static_cast<double>(s.journal_writes));
  MetricFamily records = Family("dpproxy_journal_records_total",
                                "Allocation records written to the journal.",
                                MetricType::Counter);
  AddCounter(&records, {}, static_cast<double>(s.journal_records));
  MetricFamily compactions = Family(
      "dpproxy_state_compactions_total",
      "Snapshots written to take in the journal (on their own thread, off Allocate's path).",
      MetricType::Counter);
  AddCounter(&compactions, {}, static_cast<double>(s.compactions));
  MetricFamily bytes = Family("dpproxy_state_bytes",
                              "Size of the durable state: the journal's records and the "
                              "snapshot as last written.",
                              MetricType::Gauge);
  AddGauge(&bytes, {{"file", "journal"}}, static_cast<double>(s.journal_bytes));
  AddGauge(&bytes, {{"file", "snapshot"}}, static_cast<double>(s.snapshot_bytes));
  out->push_back(std::move(bytes));
  out->push_back(std::move(journal));
  out->push_back(std::move(writes));
  out->push_back(std::move(records));
  out->push_back(std::move(compactions));
}

}  // namespace

std::vector<MetricFamily> ProxyMetrics::Collect() const {
  std::vector<MetricFamily> out;
  const ProxyStatus status = status_();
  AppendEventCounters(status, events_->Counts(), &out);
  AppendBuildInfo(&out);
  AppendDraFamilies(status, &out);
  AppendResourceFamilies(status, &out);
  AppendProcessFamilies(&out);
  AppendForgottenFamilies(status, &out);
  AppendRecoveryFamilies(status, &out);
  AppendTranslationFamilies(status, &out);
  AppendStateFamilies(status, &out);
  return out;
}

std::string ProxyMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(Collect());
}

}  // namespace dpproxy
