// File: status_model.h
//
// What a running dpproxy reports about itself, as one typed structure: the
// status file, `dpproxy status` and the Prometheus metrics are all made
// from it, so they cannot disagree. Built by ProxyServer::Status(); read
// back from the status file with StatusFromJson().
//
//   ProxyStatus st = server.Status(/*with_devices=*/false);
//   for (const ResourceStatus& r : st.resources) ... r.devices_healthy ...
//   std::cout << StatusTable(st);
#ifndef DPPROXY_PROXY_STATUS_STATUS_MODEL_H_
#define DPPROXY_PROXY_STATUS_STATUS_MODEL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "proxy/core/device_list.h"
#include "proxy/events/event_log.h"
#include "proxy/util/health_check.h"

namespace dpproxy {

struct DeviceStatus {
  std::string id;
  std::string health;  // "Healthy" | "Unhealthy"
};

struct ResourceStatus {
  std::string resource;  // the name the kubelet sees
  // "v1beta1", "v1alpha2", "v1beta1 (plugin-watcher)"; "" until registered.
  // The last one negotiated: it stays while the kubelet is away.
  std::string kubelet_api;
  // Registered with the kubelet that runs now (its /readyz check passes).
  bool kubelet_registered = false;
  std::string kubelet_socket;
  bool backend_connected = false;
  // The backend holds its stream open but answers none of the watchdog's
  // asks: treated as lost (backend_connected false) until it answers.
  bool backend_silent = false;
  std::string backend_api;       // of the last backend seen ("" if none yet)
  std::string backend_endpoint;  // ditto
  bool static_backend = false;
  // A static backend that cannot be dialled: why, and how many attempts in
  // a row failed ("" and 0 once it is reached).
  std::string backend_error;
  int64_t backend_dial_failures = 0;
  bool pre_start_required = false;
  bool get_preferred_allocation_available = false;
  int64_t devices_total = 0;
  int64_t devices_healthy = 0;
  // The list's size on the wire; over kKubeletMaxListBytes the kubelet
  // refuses it (and sees no devices).
  int64_t device_list_bytes = 0;
  bool device_list_too_large = false;
  // Why the plugin's last list was refused ("" if it was taken): the
  // kubelet keeps the list before it.
  std::string device_list_refused;
  // Device IDs with control characters, shown to the kubelet as their
  // compact IDs.
  int64_t device_ids_mapped = 0;
  // "" (off), "configured" (compact_ids) or "on by itself" (a list over the
  // kubelet's limit turned them on; they stay on across restarts).
  std::string compact_ids;
  // A name its plugin's resource is no longer served as (`renames`
  // changed): the name it is served as now. Its devices are shown
  // Unhealthy, so no new pod gets them under the old name.
  std::string now_served_as;
  // Its static backend was removed from the configuration: its devices are
  // shown Unhealthy, and a start leaves it out once no pod holds them.
  bool removed = false;
  // Devices held by containers the kubelet forgot (see ForgottenStatus):
  // how many a GetPreferredAllocation answer left out, how many it had to
  // name (too few others), and Allocates refused for naming one.
  int64_t forgotten_avoided = 0;
  int64_t forgotten_named = 0;
  int64_t forgotten_refused = 0;
  // How the kubelet is served it: "device-plugin", "dra" or "both"
  // (ProxyConfig::paths, as the last reload left it).
  std::string path;
  // Where pods of the extended resource and DRA claims may both hold
  // devices: how many each holds (hidden from the other side).
  int64_t devices_held_by_claims = 0;
  int64_t devices_held_by_pods = 0;
  // Left empty unless asked for (the metrics never need them). A status
  // built by the server points at the published list instead of copying
  // it (`device_list`); one read back from the file has `devices`.
  std::vector<DeviceStatus> devices;
  std::shared_ptr<const DeviceList> device_list;
};

// An allocation whose container still runs while the kubelet has lost
// track of it (it restarted without its checkpoint, or lists the pod
// without its devices): the kubelet counts its devices free. They keep
// their health; new pods are steered away from them and an Allocate naming
// one is refused until the container is gone.
struct ForgottenStatus {
  std::string resource;
  uint64_t allocation = 0;
  std::vector<std::string> devices;
  std::string pod;  // "namespace/name" or "" if unknown
  std::string container;
  std::string pod_uid;
  std::string reason;
  int64_t since_unix_ms = 0;
};

// A device a resource shows Unhealthy because an allocation holds it under
// another kubelet name or ID (held_elsewhere.h): until that allocation is
// released (its pod is gone).
struct HeldElsewhereStatus {
  std::string resource, device;  // as shown now
  std::string held_as_resource, held_as_device;
  uint64_t allocation = 0;
  std::string pod;  // "namespace/name" or "" if unknown
};

// A device an operator took out of service (dpctl cordon): shown Unhealthy
// to the kubelet until uncordoned.
struct CordonStatus {
  std::string resource, device;
  std::string reason;
  int64_t since_unix_ms = 0;
  uint32_t by_uid = 0;
  int64_t by_pid = 0;
};

struct StateStatus {
  std::string path;
  int64_t allocations = 0;
  int64_t save_failures = 0;
  bool writable = true;
  std::string last_write_error;
  int64_t journal_writes = 0;
  int64_t journal_records = 0;
  int64_t compactions = 0;
  int64_t journal_bytes = 0;
  int64_t snapshot_bytes = 0;  // as last written by this process
};

// DRA mode (docs/dra.md): which driver dpproxy is, and whether the kubelet
// registered it.
struct DraStatus {
  std::string driver;
  std::string node;
  std::string api_version;  // resource.k8s.io version written; "" until the server answered
  std::string registration_socket;
  bool registered = false;
  std::string api_error;  // why the API server last failed dpproxy; "" when it answers
  int64_t claims_prepared = 0;  // prepared and not unprepared
};

struct ProxyStatus {
  int64_t pid = 0;
  std::optional<DraStatus> dra;  // nullopt outside DRA mode
  std::string kubelet_root;
  std::string plugin_socket;
  std::vector<ResourceStatus> resources;
  // resource -> kind ("annotations", "cdi_devices", "topology") -> count
  std::map<std::string, std::map<std::string, int64_t>> lossy_translations;
  std::optional<StateStatus> state;  // nullopt without a state directory
  std::vector<ForgottenStatus> forgotten;
  std::vector<HeldElsewhereStatus> held_elsewhere;
  std::vector<CordonStatus> cordoned;
  int64_t devices_held_twice = 0;
  // Forgotten allocations released because their holder was gone.
  int64_t forgotten_released = 0;
  // Allocations learned back from the kubelet after a start on a damaged
  // state: in all, and by source ("kubelet_checkpoint", "pod_resources").
  int64_t allocations_recovered = 0;
  std::map<std::string, int64_t> allocations_recovered_by_source;
  // Listed by the kubelet, lacking from the journal, and not learned back
  // (some devices journaled under another allocation).
  int64_t allocations_unrecoverable = 0;
  // Refused backend registrations by reason (version, resource_name, ...).
  std::map<std::string, int64_t> registrations_rejected;
  // The /readyz checks that fail now (none: ready).
  std::vector<HealthCheck> not_ready;

  // The resource named `name`, or nullptr.
  const ResourceStatus* Find(const std::string& name) const;
};

Json StatusToJson(const ProxyStatus& status);
// The status file: StatusToJson(status) as compact text, written without
// building a JSON tree of the devices (a node per field: hundreds of bytes
// a device, for lists of 100,000).
std::string StatusFileText(ProxyStatus status);
// kInvalidArgument if `json` is not a status (missing fields keep defaults:
// a file written by an older dpproxy still reads).
absl::StatusOr<ProxyStatus> StatusFromJson(const Json& json);
// What `dpproxy status` prints.
std::string StatusTable(const ProxyStatus& status);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATUS_STATUS_MODEL_H_
