#include "proxy/status/status_model.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "proxy/kubelet_rules/kubelet_rules.h"

namespace dpproxy {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(DeviceStatus, id, health)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ResourceStatus, resource, kubelet_api,
                                                kubelet_registered, kubelet_socket, backend_connected, backend_silent, backend_api,
                                                backend_endpoint, static_backend,
                                                backend_error, backend_dial_failures,
                                                pre_start_required,
                                                get_preferred_allocation_available,
                                                devices_total, devices_healthy,
                                                device_list_bytes, device_list_too_large,
                                                device_list_refused, device_ids_mapped, compact_ids,
                                                now_served_as, removed, forgotten_avoided,
                                                forgotten_named, forgotten_refused, path,
                                                devices_held_by_claims, devices_held_by_pods,
                                                devices)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ForgottenStatus, resource, allocation, devices,
                                                pod, container, pod_uid, reason, since_unix_ms)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(HeldElsewhereStatus, resource, device,
                                                held_as_resource, held_as_device, allocation,
                                                pod)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(CordonStatus, resource, device, reason,
                                                since_unix_ms, by_uid, by_pid)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(StateStatus, path, allocations, save_failures,
                                                writable, last_write_error, journal_writes,
                                                journal_records, compactions,
                                                journal_bytes, snapshot_bytes)

const ResourceStatus* ProxyStatus::Find(const std::string& name) const {
  for (const ResourceStatus& r : resources) {
    if (r.resource == name) return &r;
  }
  return nullptr;
}

namespace {

Json NotReadyJson(const std::vector<HealthCheck>& checks) {
  Json out = Json::array();
  for (const HealthCheck& c : checks) out.push_back({{"check", c.name}, {"reason", c.reason}});
  return out;
}

}  // namespace

Json StatusToJson(const ProxyStatus& s) {
  Json dra = nullptr;
  if (s.dra.has_value()) {
    dra = {{"driver", s.dra->driver},
           {"node", s.dra->node},
           {"api_version", s.dra->api_version},
           {"registration_socket", s.dra->registration_socket},
           {"registered", s.dra->registered},
           {"api_error", s.dra->api_error},
           {"claims_prepared", s.dra->claims_prepared}};
  }
  return {{"pid", s.pid},
          {"dra", dra},
          {"kubelet_root", s.kubelet_root},
          {"plugin_socket", s.plugin_socket},
          {"resources", s.resources},
          {"lossy_translations", s.lossy_translations},
          {"state", s.state ? Json(*s.state) : Json(nullptr)},
          {"forgotten", s.forgotten},
          {"held_elsewhere", s.held_elsewhere},
          {"cordoned", s.cordoned},
          {"devices_held_twice", s.devices_held_twice},
          {"forgotten_released", s.forgotten_released},
          {"allocations_recovered", s.allocations_recovered},
          {"allocations_recovered_by_source", s.allocations_recovered_by_source},
          {"allocations_unrecoverable", s.allocations_unrecoverable},
          {"registrations_rejected", s.registrations_rejected},
          {"ready", s.not_ready.empty()},
          {"not_ready", NotReadyJson(s.not_ready)}};
}

std::string StatusFileText(ProxyStatus s) {
  std::vector<ResourceStatus> resources;
  resources.swap(s.resources);  // written below, devices without a tree
  Json top = StatusToJson(s);
  top.erase("resources");
  std::string out = top.dump();
  out.pop_back();  // the closing brace: the resources go last
  out += ",\"resources\":[";
  for (size_t i = 0; i < resources.size(); ++i) {
    const ResourceStatus& r = resources[i];
    Json head = r;
    head.erase("devices");
    std::string text = head.dump();
    text.pop_back();
    absl::StrAppend(&out, i == 0 ? "" : ",", text, ",\"devices\":[");
    // Each string through the JSON library for its escaping.
    auto append = [&out](bool first, const std::string& id, const std::string& health) {
      absl::StrAppend(&out, first ? "" : ",", "{\"id\":", Json(id).dump(),
                      ",\"health\":", Json(health).dump(), "}");
    };
    if (r.device_list != nullptr) {
      for (int k = 0; k < r.device_list->size(); ++k) {
        const DeviceList::View d = r.device_list->device(k);
        append(k == 0, std::string(d.id), std::string(d.health));
      }
    } else {
      for (size_t k = 0; k < r.devices.size(); ++k) {
        append(k == 0, r.devices[k].id, r.devices[k].health);
      }
    }
    out += "]}";
  }
  out += "]}\n";
  return out;
}

absl::StatusOr<ProxyStatus> StatusFromJson(const Json& j) {
  if (!j.is_object() || !j.contains("resources")) {
    return absl::InvalidArgumentError("not a dpproxy status (no \"resources\")");
  }
  ProxyStatus s;
  try {
    s.pid = j.value("pid", int64_t{0});
    s.kubelet_root = j.value("kubelet_root", "");
    s.plugin_socket = j.value("plugin_socket", "");
    j.at("resources").get_to(s.resources);
    // A file from a dpproxy that did not say: registered once negotiated.
    for (size_t i = 0; i < s.resources.size(); ++i) {
      if (!j["resources"][i].contains("kubelet_registered")) {
        s.resources[i].kubelet_registered = !s.resources[i].kubelet_api.empty();
      }
    }
    if (j.contains("lossy_translations")) j["lossy_translations"].get_to(s.lossy_translations);
    if (j.contains("state") && j["state"].is_object()) s.state = j["state"].get<StateStatus>();
    if (j.contains("forgotten")) j["forgotten"].get_to(s.forgotten);
    if (j.contains("held_elsewhere")) j["held_elsewhere"].get_to(s.held_elsewhere);
    if (j.contains("cordoned")) j["cordoned"].get_to(s.cordoned);
    s.devices_held_twice = j.value("devices_held_twice", int64_t{0});
    s.forgotten_released = j.value("forgotten_released", int64_t{0});
    s.allocations_recovered = j.value("allocations_recovered", int64_t{0});
    s.allocations_unrecoverable = j.value("allocations_unrecoverable", int64_t{0});
    if (j.contains("allocations_recovered_by_source")) {
      j["allocations_recovered_by_source"].get_to(s.allocations_recovered_by_source);
    }
    if (j.contains("dra") && j["dra"].is_object()) {
      const Json& d = j["dra"];
      s.dra = DraStatus{d.value("driver", ""), d.value("node", ""), d.value("api_version", ""),
                        d.value("registration_socket", ""), d.value("registered", false),
                        d.value("api_error", ""), d.value("claims_prepared", int64_t{0})};
    }
    if (j.contains("not_ready") && j["not_ready"].is_array()) {
      for (const Json& c : j["not_ready"]) {
        s.not_ready.push_back({c.value("check", ""), false, c.value("reason", "")});
      }
    }
    if (j.contains("registrations_rejected")) {
      j["registrations_rejected"].get_to(s.registrations_rejected);
    }
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not a dpproxy status: ", e.what()));
  }
  return s;
}

namespace {

// Who runs, where plugins register, whether it is ready, and DRA's driver.
std::string StatusHeader(const ProxyStatus& st) {
  std::string out = absl::StrCat("dpproxy pid ", st.pid, ", kubelet root ", st.kubelet_root,
                                 ", plugins register at ", st.plugin_socket, "\n");
  if (st.not_ready.empty()) {
    out += "ready\n";
  } else {
    out += "NOT READY:\n";
    for (const HealthCheck& c : st.not_ready) {
      absl::StrAppend(&out, "  ", c.name, ": ", c.reason, "\n");
    }
  }
  if (st.dra.has_value()) {
    absl::StrAppend(&out, "DRA driver ", st.dra->driver, " on node ", st.dra->node, " (",
                    st.dra->api_version.empty() ? "API version not known yet" : st.dra->api_version,
                    "): ",
                    st.dra->registered ? absl::StrCat("registered with the kubelet, ",
                                                      st.dra->claims_prepared,
                                                      " claim(s) prepared")
                                       : absl::StrCat("NOT registered with the kubelet (its "
                                                      "plugin watcher reads ",
                                                      st.dra->registration_socket, ")"),
                    "\n");
    if (!st.dra->api_error.empty()) {
      absl::StrAppend(&out, "API server: ", st.dra->api_error, "\n");
    }
  }
  return out;
}

// The lines under a resource's row that say what is wrong or unusual.
std::string ResourceNotes(const ResourceStatus& r) {
  std::string out;
  if (r.devices_held_by_claims > 0 || r.devices_held_by_pods > 0) {
    absl::StrAppend(&out, "  ^ held through DRA claims: ", r.devices_held_by_claims,
                    " device(s), Unhealthy to the device manager; by pods of the extended "
                    "resource: ",
                    r.devices_held_by_pods, ", out of the DRA pool\n");
  }
  if (!r.backend_error.empty()) {
    absl::StrAppend(&out, "  ^ STATIC BACKEND CANNOT BE DIALLED (", r.backend_dial_failures,
                    " attempt(s)): ", r.backend_error, "\n");
  }
  if (r.device_list_too_large) {
    absl::StrAppendFormat(
        &out,
        "  ^ DEVICE LIST TOO LARGE for the kubelet: %d bytes, the kubelet accepts %d; it "
        "sees no devices of this resource\n",
        r.device_list_bytes, kKubeletMaxListBytes);
  }
  if (!r.device_list_refused.empty()) {
    absl::StrAppend(&out, "  ^ DEVICE LIST REFUSED: ", r.device_list_refused,
                    "; the kubelet keeps the list before it\n");
  }
  if (r.compact_ids == "on by itself") {
    absl::StrAppend(&out, "  ^ compact device IDs are on by themselves (a list was over the "
                          "kubelet's limit); they stay on, as the kubelet knows the devices "
                          "by them\n");
  }
  if (r.device_ids_mapped > 0) {
    absl::StrAppend(&out, "  ^ ", r.device_ids_mapped,
                    " device ID(s) with control characters are shown to the kubelet as "
                    "compact IDs\n");
  }
  if (!r.now_served_as.empty()) {
    absl::StrAppend(&out, "  ^ RENAMED: served as ", r.now_served_as,
                    " now; its devices are shown Unhealthy under this name\n");
  }
  if (r.removed) {
    absl::StrAppend(&out, "  ^ REMOVED from the configuration: its devices are shown "
                          "Unhealthy; left out at the next start once no pod holds them\n");
  }
  return out;
}

// The resources, a row each.
std::string ResourceRows(const ProxyStatus& st) {
  std::string out;
  out += "\n";
  absl::StrAppendFormat(&out, "%-28s %-26s %-9s %-40s %s\n", "RESOURCE", "KUBELET API",
                        "BACKEND", "BACKEND ENDPOINT", "DEVICES");
  for (const ResourceStatus& r : st.resources) {
    absl::StrAppendFormat(
        &out, "%-28s %-26s %-9s %-40s %d/%d healthy\n", r.resource,
        r.kubelet_registered ? r.kubelet_api
        : r.kubelet_api.empty() ? std::string("(not registered)")
                                : absl::StrCat("(away; was ", r.kubelet_api, ")"),
        r.backend_connected ? r.backend_api
        : r.backend_silent  ? "silent"
                            : "down",
        r.backend_endpoint.empty() ? "-" : r.backend_endpoint, r.devices_healthy,
        r.devices_total);
    out += ResourceNotes(r);
  }
  return out;
}

// The durable state, and allocations learned back after damage.
std::string StateLines(const ProxyStatus& st) {
  std::string out;
  if (st.state) {
    absl::StrAppend(&out, "\nstate ", st.state->path, ": ", st.state->allocations,
                    " allocation(s), ");
    if (st.state->writable) {
      absl::StrAppend(&out, "writable");
    } else {
      absl::StrAppend(&out, "NOT WRITABLE (every Allocate is refused until it is): ",
                      st.state->last_write_error);
    }
    absl::StrAppend(&out, ", ", st.state->save_failures, " failed write(s)\n");
    if (st.allocations_recovered > 0 || st.allocations_unrecoverable > 0) {
      std::vector<std::string> from;
      for (const auto& [source, n] : st.allocations_recovered_by_source) {
        if (n > 0) from.push_back(absl::StrCat(n, " from ", source));
      }
      absl::StrAppend(&out, "  ^ LEARNED BACK after damage: ", st.allocations_recovered,
                      " allocation(s)", from.empty() ? "" : " (", absl::StrJoin(from, ", "),
                      from.empty() ? "" : ")");
      if (st.allocations_unrecoverable > 0) {
        absl::StrAppend(&out, "; ", st.allocations_unrecoverable,
                        " could not be (devices journaled under another allocation)");
      }
      absl::StrAppend(&out, "\n");
    }
  }
  return out;
}

// Devices the kubelet forgot or that are held under another name, and what
// was lost in translation.
std::string HeldDevices(const ProxyStatus& st) {
  std::string out;
  if (!st.forgotten.empty()) {
    absl::StrAppend(&out,
                    "\nFORGOTTEN BY THE KUBELET (still in use; new pods are steered away and "
                    "refused until the container is gone):\n");
    for (const ForgottenStatus& q : st.forgotten) {
      std::string holder = q.pod;
      if (holder.empty()) {
        holder = q.pod_uid.empty() ? absl::StrCat("allocation ", q.allocation, " (pod unknown)")
                                   : absl::StrCat("pod UID ", q.pod_uid);
      } else if (!q.container.empty()) {
        absl::StrAppend(&holder, "/", q.container);
      }
      std::vector<std::string> shown;
      for (const std::string& d : q.devices) shown.push_back(PrintableId(d));
      absl::StrAppend(&out, "  ", q.resource, " ", absl::StrJoin(shown, ","), " held by ",
                      holder, ": ", q.reason, "\n");
    }
  }
  if (!st.held_elsewhere.empty()) {
    absl::StrAppend(&out,
                    "\nHELD UNDER ANOTHER NAME OR ID (renames, ID maps or compact IDs changed; "
                    "reported Unhealthy until the pod is gone):\n");
    for (const HeldElsewhereStatus& h : st.held_elsewhere) {
      absl::StrAppend(&out, "  ", h.resource, " ", h.device, " is ", h.held_as_resource, " ",
                      h.held_as_device, " held by ",
                      h.pod.empty() ? absl::StrCat("allocation ", h.allocation, " (pod unknown)")
                                    : h.pod,
                      "\n");
    }
  }
  if (!st.cordoned.empty()) {
    absl::StrAppend(&out, "\nCORDONED (taken out of service by hand; reported Unhealthy until "
                          "dpctl uncordon):\n");
    for (const CordonStatus& c : st.cordoned) {
      absl::StrAppend(&out, "  ", c.resource, " ", PrintableId(c.device), " since ",
                      absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(c.since_unix_ms),
                                       absl::LocalTimeZone()),
                      " by uid ", c.by_uid, ": ", c.reason, "\n");
    }
  }
  if (st.devices_held_twice > 0) {
    absl::StrAppend(&out, "\n", st.devices_held_twice,
                    " device(s) found held by two pods (see the device_held_twice events)\n");
  }
  if (!st.lossy_translations.empty()) {
    absl::StrAppend(&out, "\nlossy translations: ", Json(st.lossy_translations).dump(), "\n");
  }
  return out;
}

}  // namespace

std::string StatusTable(const ProxyStatus& st) {
  return absl::StrCat(StatusHeader(st), ResourceRows(st), StateLines(st), HeldDevices(st));
}

}  // namespace dpproxy
