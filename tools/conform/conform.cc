#include "tools/conform/conform.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/util/files.h"
#include "tools/conform/cell.h"
#include "tools/conform/dra.h"
#include "tools/conform/real.h"

namespace dpproxy::conform {
namespace {

constexpr int64_t kKubeletReceiveLimit = 4 * 1024 * 1024;

std::string Ms(absl::Duration d) { return absl::StrCat(absl::ToInt64Milliseconds(d), " ms"); }

// Admits a pod with one container per entry of `containers` (resource,
// count); a Problem owned by the scenario the failure belongs to.
absl::StatusOr<sim::AllocateResponse> Admit(
    Cell& cell, const std::string& pod,
    const std::vector<std::pair<std::string, int>>& containers, Problem* problem) {
  sim::AllocateRequest req;
  req.set_pod_name(pod);
  for (size_t i = 0; i < containers.size(); ++i) {
    sim::ContainerRequest* c = req.add_containers();
    c->set_name(absl::StrCat("c", i));
    c->set_resource(containers[i].first);
    c->set_count(containers[i].second);
  }
  absl::StatusOr<sim::AllocateResponse> r = cell.kubelet().Allocate(req);
  if (!r.ok()) {
    const std::string msg(r.status().message());
    problem->owner = AdmissionOwner(msg);
    problem->summary = absl::StrCat("pod admission failed: ", msg);
    if (problem->owner == "device-list") {
      problem->summary = absl::StrCat(
          "the kubelet refused the pod before any Allocate reached the plugin: ", msg);
      problem->plugin_did = "received no Allocate: the kubelet's device list had too few healthy "
                            "devices at that moment";
      problem->kubelet_expects = "the devices the plugin lists stay Healthy while they are";
      problem->users_see = absl::StrCat("the pod fails with UnexpectedAdmissionError: ", msg);
    } else if (problem->owner == "prestart") {
      problem->plugin_did = "failed PreStartContainer";
      problem->kubelet_expects = "PreStartContainer succeeds (30 s deadline) when the plugin "
                                 "asks for it with pre_start_required";
      problem->users_see = absl::StrCat("the container does not start: RunContainerError (",
                                        msg, ")");
    } else if (problem->owner == "preferred") {
      problem->plugin_did = "failed GetPreferredAllocation";
      problem->kubelet_expects = "from 1.19, an offered GetPreferredAllocation answers; an "
                                 "error fails admission";
      problem->users_see = absl::StrCat("the pod fails admission: ", msg);
    } else {
      problem->plugin_did = absl::StrCat("answered Allocate so that admission failed");
      problem->kubelet_expects = "one ContainerAllocateResponse for each ContainerAllocateRequest "
                                 "(the kubelet sends one per container and reads the first)";
      problem->users_see = absl::StrCat("the pod fails with UnexpectedAdmissionError: ", msg);
    }
  }
  return r;
}

// --- Scenarios ----------------------------------------------------------------------

CellResult Registers(Cell& c) {
  if (auto p = c.Reach(Stage::kConnected, c.resource())) return FromProblem("registers", *p);
  // The kubelet records the registration just after it connected.
  std::optional<Json> reg = c.events().WaitForEvent("registered", {{"resource", c.resource()}},
                                                    c.options().timeout);
  std::optional<Json> req = c.events().WaitForEvent(
      "register_request", {{"resource", c.resource()}}, absl::ZeroDuration());
  std::vector<std::string> notes;
  if (req.has_value()) {
    notes.push_back(absl::StrCat("version \"", req->value("version", ""), "\", endpoint \"",
                                 req->value("endpoint", ""), "\""));
  }
  const std::string via = reg.has_value() ? reg->value("via", "") : "kubelet.sock";
  return Pass(absl::StrCat("registered ", c.resource(), " through ", via), notes);
}

CellResult ServesFirst(Cell& c) {
  if (auto p = c.Reach(Stage::kConnected, c.resource())) return FromProblem("serves-first", *p);
  std::optional<Json> req = c.events().WaitForEvent(
      "register_request", {{"resource", c.resource()}}, absl::ZeroDuration());
  if (!req.has_value()) {
    return NotApplicable("registers through the plugin watcher, which dials the plugin itself");
  }
  if (!req->value("endpoint_listening", true)) {
    // Only a release that registers asynchronously gets here.
    return Pass("registered before serving: this release dials later",
                {"not serving when it called Register: kubelets from 1.25 fail that "
                 "registration (\"failed to dial device plugin\")"});
  }
  return Pass("its socket accepted connections when Register arrived");
}

CellResult DeviceList(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("device-list", *p);
  std::vector<sim::DeviceState> devices = c.Devices(c.resource());
  int healthy = 0, with_numa = 0;
  for (const sim::DeviceState& d : devices) {
    if (d.health() == "Healthy") ++healthy;
    if (d.numa_nodes_size() > 0) ++with_numa;
  }
  std::vector<std::string> notes;
  if (with_numa > 0) notes.push_back(absl::StrCat(with_numa, " devices with NUMA topology"));
  return Pass(absl::StrCat(devices.size(), " devices, ", healthy, " healthy"), notes);
}

CellResult ListSize(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("list-size", *p);
  v1beta1::ListAndWatchResponse list;
  for (const sim::DeviceState& d : c.Devices(c.resource())) {
    v1beta1::Device* out = list.add_devices();
    out->set_id(d.id());
    out->set_health(d.health());
    for (int64_t n : d.numa_nodes()) out->mutable_topology()->add_nodes()->set_id(n);
  }
  const int64_t bytes = static_cast<int64_t>(list.ByteSizeLong());
  return Pass(absl::StrFormat("%d devices in %.1f KiB: %.2f%% of the kubelet's 4 MiB limit",
                              list.devices_size(), bytes / 1024.0,
                              100.0 * static_cast<double>(bytes) / kKubeletReceiveLimit));
}

CellResult PluginWatcher(Cell& c) {
  if (!c.version().plugin_watcher) {
    return NotApplicable(absl::StrCat("kubelet ", c.version().name,
                                      " has no plugin watcher (device plugins use it from 1.13)"));
  }
  if (auto p = c.Reach(Stage::kConnected, c.resource())) return FromProblem("plugin-watcher", *p);
  // The kubelet records the registration just after it connected.
  std::optional<Json> reg = c.events().WaitForEvent("registered", {{"resource", c.resource()}},
                                                    c.options().timeout);
  if (!reg.has_value() || reg->value("via", "") != "plugin-watcher") {
    return NotApplicable("registers through kubelet.sock; offers no plugin-watcher socket");
  }
  return Pass("registered through plugins_registry/ (GetInfo, then the kubelet dialled the "
              "endpoint)");
}

CellResult Health(Cell& c) {
  if (c.options().health_command.empty()) {
    return NotApplicable("no --health_command: dpconform cannot make a device unhealthy");
  }
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("health", *p);
  std::string device;
  for (const sim::DeviceState& d : c.Devices(c.resource())) {
    if (d.health() == "Healthy") {
      device = d.id();
      break;
    }
  }
  std::vector<std::string> notes;
  for (const char* health : {"Unhealthy", "Healthy"}) {
    const size_t from = c.events().Size();
    const absl::Time start = absl::Now();
    if (absl::Status s = c.SetHealth(device, health); !s.ok()) {
      return Fail(absl::StrCat("the health command failed: ", s.message()),
                  "(the test harness, not the plugin: --health_command failed)",
                  "a way to change a device's health", "nothing: fix --health_command");
    }
    std::optional<Json> e = c.events().WaitFor(
        [&](const Json& j) {
          const std::string n = j.value("event", "");
          if (j.value("resource", "") != c.resource()) return false;
          if (n == "plugin_lost") return true;
          if (n != "devices") return false;
          for (const Json& d : j["devices"]) {
            if (d.value("id", "") == device && d.value("health", "") == health) return true;
          }
          return false;
        },
        c.options().timeout, from);
    if (!e.has_value()) {
      return Fail(absl::StrCat("the change to ", health, " never reached the kubelet"),
                  absl::StrCat("was told to make ", device, " ", health,
                               "; no list with that health followed within ",
                               absl::FormatDuration(c.options().timeout)),
                  "a new full list on the open ListAndWatch stream at every change",
                  health == std::string("Unhealthy")
                      ? "the kubelet keeps handing out a broken device"
                      : "a repaired device stays out of use (allocatable stays low)");
    }
    if (e->value("event", "") == "plugin_lost") {
      return Fail("the ListAndWatch stream ended at a health change",
                  absl::StrCat("ended its ListAndWatch stream (", e->value("reason", ""),
                               ") instead of sending the new list on it"),
                  "one stream for the plugin's life; the kubelet never opens another without "
                  "a new registration",
                  "at the first health change every device turns unhealthy and allocatable "
                  "drops to 0");
    }
    notes.push_back(absl::StrCat(device, " ", health, " seen after ", Ms(absl::Now() - start)));
  }
  return Pass("a device's health change reached the kubelet, both ways", notes);
}

// Host paths a container is given device nodes (and CDI devices) through.
std::vector<std::string> DeviceAccess(const v1beta1::ContainerAllocateResponse& r) {
  std::vector<std::string> out;
  for (const auto& d : r.devices()) out.push_back(d.host_path());
  for (const auto& d : r.cdi_devices()) out.push_back(absl::StrCat("cdi:", d.name()));
  return out;
}

// Whether `text` names the device `id`: `id` in it, not as part of a
// longer word ("gpu-1" names gpu-1 in "/dev/gpu-1" and "GPU=gpu-1,gpu-2",
// not in "/dev/gpu-10").
bool NamesDevice(absl::string_view text, absl::string_view id) {
  auto word = [](char ch) { return absl::ascii_isalnum(static_cast<unsigned char>(ch)); };
  for (size_t at = text.find(id); at != absl::string_view::npos; at = text.find(id, at + 1)) {
    const size_t end = at + id.size();
    if ((at == 0 || !word(text[at - 1])) && (end == text.size() || !word(text[end]))) {
      return true;
    }
  }
  return false;
}

// What gives a container access to a device, as "what: value": device
// nodes, mounts, CDI devices and environment variables.
std::vector<std::pair<std::string, std::string>> Grants(
    const v1beta1::ContainerAllocateResponse& r) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& d : r.devices()) out.emplace_back("device node", d.host_path());
  for (const auto& m : r.mounts()) out.emplace_back("mount", m.host_path());
  for (const auto& d : r.cdi_devices()) out.emplace_back("CDI device", d.name());
  for (const auto& [k, v] : r.envs()) out.emplace_back("environment variable", k + "=" + v);
  return out;
}

// The real bug behind two containers sharing a device: a container's
// answer names a device the plugin lists that the kubelet did not give it
// (counted free, or another container's). A node every container gets
// names none, and is fine.
std::optional<CellResult> OtherDeviceGranted(const sim::ContainerAllocation& a,
                                             const std::vector<std::string>& listed,
                                             int container) {
  const std::set<std::string> own(a.device_ids().begin(), a.device_ids().end());
  // Its own IDs out first, longest first: "gpu-1" is not named by
  // "/dev/gpu-1-a" when gpu-1-a is the container's.
  std::vector<std::string> mine(own.begin(), own.end());
  std::sort(mine.begin(), mine.end(),
            [](const std::string& x, const std::string& y) { return x.size() > y.size(); });
  for (const auto& [what, value] : Grants(a.response())) {
    std::string rest = value;
    for (const std::string& m : mine) rest = absl::StrReplaceAll(rest, {{m, "\x01"}});
    for (const std::string& id : listed) {
      if (own.count(id) > 0 || !NamesDevice(rest, id)) continue;
      return Fail(absl::StrCat("container ", container, " was given ", id, "'s ", what),
                  absl::StrCat("answered Allocate for ", absl::StrJoin(own, ","), " with ", what,
                               " ", value, ", which names ", id, " (not in that request)"),
                  "each Allocate answers for the devices in its own request; what every "
                  "container gets (a control node) names no device",
                  absl::StrCat("the container uses ", id,
                               " while the kubelet counts it free or another container's: "
                               "two pods share one device"));
    }
  }
  return std::nullopt;
}

std::optional<CellResult> CheckResponse(Cell& c, const sim::ContainerAllocation& a,
                                        const Json& unread) {
  const v1beta1::ContainerAllocateResponse& r = a.response();
  for (const auto& m : r.mounts()) {
    if (!absl::StartsWith(m.container_path(), "/") || !absl::StartsWith(m.host_path(), "/")) {
      return Fail("a mount path is not absolute",
                  absl::StrCat("returned mount ", m.host_path(), " -> ", m.container_path()),
                  "absolute host and container paths (the runtime creates the mount)",
                  "the container fails to start (CreateContainerError)");
    }
  }
  for (const auto& d : r.devices()) {
    const bool perms = !d.permissions().empty() &&
                       d.permissions().find_first_not_of("rwm") == std::string::npos;
    if (!absl::StartsWith(d.container_path(), "/") || !absl::StartsWith(d.host_path(), "/") ||
        !perms) {
      return Fail("a device spec is malformed",
                  absl::StrCat("returned device ", d.host_path(), " -> ", d.container_path(),
                               " with permissions \"", d.permissions(), "\""),
                  "absolute paths and permissions made of r, w and m",
                  "the container fails to start (CreateContainerError)");
    }
  }
  const bool cdi_unread =
      std::find(unread.begin(), unread.end(), "cdi_devices") != unread.end();
  if (cdi_unread && r.devices_size() == 0 && r.mounts_size() == 0 && r.envs_size() == 0) {
    return Fail(
        absl::StrCat("the container gets nothing: kubelet ", c.version().name,
                     " does not read cdi_devices"),
        "answered Allocate with cdi_devices only (no device specs, mounts or envs)",
        c.version().minor >= 28
            ? "cdi_devices are read from 1.28 only with the DevicePluginCDIDevices gate on "
              "(default from 1.29, GA in 1.31)"
            : "cdi_devices are read from 1.28 (with the gate; GA in 1.31); this release's "
              "API has no such field and drops it",
        "the container starts without the device");
  }
  return std::nullopt;
}

std::string DescribeResponse(const v1beta1::ContainerAllocateResponse& r, const Json& unread) {
  std::vector<std::string> parts = {
      absl::StrCat(r.envs_size(), " envs"), absl::StrCat(r.mounts_size(), " mounts"),
      absl::StrCat(r.devices_size(), " device specs"),
      absl::StrCat(r.annotations_size(), " annotations"),
      absl::StrCat(r.cdi_devices_size(), " CDI devices")};
  std::string out = absl::StrJoin(parts, ", ");
  if (!unread.empty()) {
    std::vector<std::string> u;
    for (const Json& f : unread) u.push_back(f.get<std::string>());
    absl::StrAppend(&out, " (not read by this release: ", absl::StrJoin(u, ", "), ")");
  }
  return out;
}

Json UnreadFor(Cell& c, size_t from, const std::string& pod, const std::string& container) {
  std::optional<Json> e = c.events().WaitForEvent(
      "allocated", {{"pod", pod}, {"container", container}}, absl::ZeroDuration(), from);
  return e.has_value() && e->contains("unread") ? (*e)["unread"] : Json::array();
}

CellResult Allocate(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("allocate", *p);
  const size_t from = c.events().Size();
  Problem problem;
  absl::StatusOr<sim::AllocateResponse> r = Admit(c, "one", {{c.resource(), 1}}, &problem);
  if (!r.ok()) return FromProblem("allocate", problem);
  const sim::ContainerAllocation& a = r->allocations(0);
  const Json unread = UnreadFor(c, from, "one", "c0");
  if (auto bad = CheckResponse(c, a, unread)) return *bad;
  return Pass(absl::StrCat("one container given ", a.device_ids(0)),
              {DescribeResponse(a.response(), unread)});
}

CellResult AllocateTwo(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("allocate-two", *p);
  // Devices the plugin lists, whatever their health at this instant (one
  // Unhealthy for a moment does not make the scenario inapplicable).
  const size_t devices = c.Devices(c.resource()).size();
  if (devices < 2) {
    return NotApplicable(absl::StrCat("the plugin lists ", devices,
                                      " device; two containers need two"));
  }
  const size_t from = c.events().Size();
  Problem problem;
  absl::StatusOr<sim::AllocateResponse> r =
      Admit(c, "two", {{c.resource(), 1}, {c.resource(), 1}}, &problem);
  if (!r.ok()) return FromProblem("allocate-two", problem);
  if (r->allocations_size() != 2) {
    return Fail("the pod did not get two containers' allocations", "", "", "");
  }
  for (int i = 0; i < 2; ++i) {
    if (auto bad = CheckResponse(c, r->allocations(i),
                                 UnreadFor(c, from, "two", absl::StrCat("c", i)))) {
      // What a response holds is the allocate cell's check.
      return FromProblem("allocate-two",
                         Problem{"allocate", bad->summary, bad->plugin_did,
                                 bad->kubelet_expects, bad->users_see});
    }
  }
  std::vector<std::string> listed;
  for (const sim::DeviceState& d : c.Devices(c.resource())) listed.push_back(d.id());
  for (int i = 0; i < 2; ++i) {
    const sim::ContainerAllocation& a = r->allocations(i);
    if (std::optional<CellResult> bad = OtherDeviceGranted(a, listed, i + 1)) return *bad;
  }
  // What both get whatever they were given names no device: a control
  // node, as GPU plugins give every container (never a kubelet check).
  std::vector<std::string> shared;
  const std::vector<std::string> second = DeviceAccess(r->allocations(1).response());
  for (const std::string& path : DeviceAccess(r->allocations(0).response())) {
    if (std::find(second.begin(), second.end(), path) != second.end()) shared.push_back(path);
  }
  return Pass(absl::StrCat("two containers given ", r->allocations(0).device_ids(0), " and ",
                           r->allocations(1).device_ids(0), ", one response each"),
              shared.empty() ? std::vector<std::string>()
                             : std::vector<std::string>{absl::StrCat(
                                   "both also get ", absl::StrJoin(shared, ", "),
                                   ", which names no device: a node every container gets "
                                   "(as GPU plugins give their control nodes)")});
}

CellResult Preferred(Cell& c) {
  if (!c.version().CallsGetPreferredAllocation()) {
    return NotApplicable(absl::StrCat("kubelet ", c.version().name,
                                      " never calls GetPreferredAllocation (1.19+)"));
  }
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("preferred", *p);
  std::optional<Json> conn = c.events().WaitForEvent(
      "plugin_connected", {{"resource", c.resource()}}, absl::ZeroDuration());
  if (!conn.has_value() || !conn->value("get_preferred_allocation_available", false)) {
    return NotApplicable("the plugin does not offer GetPreferredAllocation");
  }
  int healthy = 0;
  for (const sim::DeviceState& d : c.Devices(c.resource())) healthy += d.health() == "Healthy";
  const int size = std::min(healthy, 2);
  const size_t from = c.events().Size();
  Problem problem;
  absl::StatusOr<sim::AllocateResponse> r = Admit(c, "preferred", {{c.resource(), size}}, &problem);
  if (!r.ok()) return FromProblem("preferred", problem);
  std::optional<Json> e = c.events().WaitForEvent(
      "preferred_allocation", {{"resource", c.resource()}}, absl::ZeroDuration(), from);
  if (!e.has_value()) return Fail("GetPreferredAllocation was not called", "", "", "");
  std::vector<std::string> returned = (*e)["returned"].get<std::vector<std::string>>();
  std::vector<std::string> available = (*e)["available"].get<std::vector<std::string>>();
  std::set<std::string> unique(returned.begin(), returned.end());
  std::vector<std::string> unknown;
  for (const std::string& id : returned) {
    if (std::find(available.begin(), available.end(), id) == available.end()) {
      unknown.push_back(id);
    }
  }
  if (static_cast<int>(returned.size()) != size || unique.size() != returned.size() ||
      !unknown.empty() || e->value("container_responses", 0) != 1) {
    return Fail(
        absl::StrCat("preferred ", returned.size(), " devices for a request of ", size),
        absl::StrCat("answered GetPreferredAllocation (allocation_size ", size, ", ",
                     available.size(), " available) with ", e->value("container_responses", 0),
                     " container responses and devices [", absl::StrJoin(returned, ", "), "]",
                     unknown.empty() ? "" : absl::StrCat("; not available: ",
                                                         absl::StrJoin(unknown, ", "))),
        "one container response with exactly allocation_size distinct IDs from the "
        "available ones, must_include among them",
        "the kubelet drops what it cannot use and fills up with its own choice: the "
        "plugin's placement (NUMA, links) is silently lost");
  }
  return Pass(absl::StrCat("preferred [", absl::StrJoin(returned, ", "), "] for ", size),
              {absl::StrCat("pod given ", absl::StrJoin(r->allocations(0).device_ids(), ", "))});
}

CellResult PreStart(Cell& c) {
  if (c.version().personality == sim::Personality::kV1Alpha) {
    return NotApplicable("1.9 has no PreStartContainer");
  }
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("prestart", *p);
  std::optional<Json> conn = c.events().WaitForEvent(
      "plugin_connected", {{"resource", c.resource()}}, absl::ZeroDuration());
  if (!conn.has_value() || !conn->value("pre_start_required", false)) {
    return NotApplicable(c.version().minor >= 25
                             ? "the plugin does not ask for PreStartContainer"
                             : "the plugin's RegisterRequest options do not ask for "
                               "PreStartContainer (1.10-1.24 read them there)");
  }
  Problem problem;
  absl::StatusOr<sim::AllocateResponse> r = Admit(c, "prestart", {{c.resource(), 1}}, &problem);
  if (!r.ok()) return FromProblem("prestart", problem);
  if (!r->allocations(0).pre_started()) {
    return Fail("PreStartContainer was not called", "", "", "");
  }
  return Pass("PreStartContainer succeeded before the container started");
}

CellResult KubeletRestart(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("kubelet-restart", *p);
  const size_t from = c.events().Size();
  const absl::Time start = absl::Now();
  if (absl::Status s = c.kubelet().Restart(c.version()); !s.ok()) {
    return Fail(absl::StrCat("dpconform could not restart its kubelet: ", s.message()), "", "",
                "");
  }
  // A refused Register is not the end: a plugin whose fresh socket the
  // start-up cleanup removed may notice, serve again and register again
  // within the timeout.
  std::optional<Problem> p =
      c.Reach(Stage::kDevices, c.resource(), from, /*tolerate_rejections=*/true);
  if (!p.has_value()) {
    return Pass(absl::StrCat("registered again ", Ms(absl::Now() - start),
                             " after the kubelet restarted"));
  }
  std::optional<Json> again = c.events().WaitForEvent(
      "register_request", {{"resource", c.resource()}}, absl::ZeroDuration(), from);
  const bool watcher = c.events()
                           .WaitForEvent("watcher_found", Json::object(), absl::ZeroDuration(),
                                         from)
                           .has_value();
  if (!again.has_value() && !watcher) {
    return Fail("never registered again after the kubelet restarted",
                absl::StrCat("kept running but did not call Register on the new kubelet.sock "
                             "within ",
                             absl::FormatDuration(c.options().timeout)),
                "a kubelet start removes every socket in device-plugins/ and forgets all "
                "plugins: each must notice (its socket gone, or kubelet.sock recreated) and "
                "register again",
                "after any kubelet restart (an upgrade, a config change) the resource's "
                "allocatable drops to 0 and stays there");
  }
  if (p->owner == "registers" || p->owner == "serves-first") {
    // The first registration worked: what failed is the one after the restart.
    return Fail(absl::StrCat("registered again but did not recover: ", p->summary),
                p->plugin_did, p->kubelet_expects, p->users_see);
  }
  return FromProblem("kubelet-restart", *p);
}

CellResult KubeletCrash(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("kubelet-crash", *p);
  const size_t from = c.events().Size();
  c.kubelet().Stop();
  // The stress: a second cleanup of device-plugins/ after the new
  // kubelet.sock appeared, as the plugin's Register arrives (a real kubelet
  // cleans up before it listens).
  c.kubelet().SetLateWipe(c.options().timeout);
  const absl::Time start = absl::Now();
  if (absl::Status s = c.kubelet().Start(); !s.ok()) {
    return Fail(absl::StrCat("dpconform could not start its kubelet again: ", s.message()), "",
                "", "");
  }
  std::optional<Problem> p =
      c.Reach(Stage::kDevices, c.resource(), from, /*tolerate_rejections=*/true);
  if (!p.has_value()) {
    return Pass(absl::StrCat("back ", Ms(absl::Now() - start),
                             " after the kubelet came back, through a late cleanup"));
  }
  std::optional<Json> again = c.events().WaitForEvent(
      "register_request", {{"resource", c.resource()}}, absl::ZeroDuration(), from);
  if (!again.has_value()) {
    CellResult r;
    r.outcome = Outcome::kBlocked;
    r.blocked_by = "kubelet-restart";
    r.summary = "not reached: the plugin never registered again (kubelet-restart's check)";
    return r;
  }
  std::optional<Json> wiped = c.events().WaitForEvent(
      "directory_cleaned", {{"late", true}}, absl::ZeroDuration(), from);
  return Fail(
      "lost its socket to the kubelet's late cleanup and did not serve it again",
      absl::StrCat("registered with the new kubelet, but its socket was removed by the "
                   "start-up cleanup",
                   wiped.has_value() ? absl::StrCat(" (", (*wiped)["removed"].dump(), ")") : "",
                   " and it neither served it again nor registered again"),
      "(a stress, not a known kubelet behaviour) a plugin that watches its own socket "
      "serves it again and registers again whenever it is removed",
      "only if something removes the socket after the kubelet listens: the resource then "
      "stays at allocatable 0 until the plugin restarts");
}

CellResult PluginRestart(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("plugin-restart", *p);
  const size_t devices = c.Devices(c.resource()).size();
  if (devices < 2) {
    return NotApplicable(absl::StrCat("the plugin lists ", devices,
                                      " device; the running pod and a new pod after the "
                                      "restart need two"));
  }
  Problem problem;
  absl::StatusOr<sim::AllocateResponse> r = Admit(c, "running", {{c.resource(), 1}}, &problem);
  if (!r.ok()) return FromProblem("plugin-restart", problem);
  const std::string held = r->allocations(0).device_ids(0);
  const size_t before_stop = c.events().Size();
  const std::string ended = c.StopPlugin();
  // A restarted pod takes longer to come back than the kubelet takes to see
  // the old stream end; starting at once could race that (and 1.25-1.36
  // would then tear the new registration down by name).
  c.events().WaitForEvent("plugin_lost", {{"resource", c.resource()}}, c.options().timeout,
                          before_stop);
  const size_t from = c.events().Size();
  if (absl::Status s = c.StartPlugin(); !s.ok()) {
    return Fail(absl::StrCat("dpconform could not start the plugin again: ", s.message()), "",
                "", "");
  }
  const absl::Time start = absl::Now();
  if (auto p = c.Reach(Stage::kDevices, c.resource(), from)) {
    if (p->owner == "registers" || p->owner == "serves-first") p->owner = "plugin-restart";
    return FromProblem("plugin-restart", *p);
  }
  std::vector<std::string> notes = {absl::StrCat("stopped with SIGTERM: ", ended),
                                    absl::StrCat("registered again in ", Ms(absl::Now() - start))};
  bool listed = false;
  std::vector<std::string> ids;
  for (const sim::DeviceState& d : c.Devices(c.resource())) {
    ids.push_back(d.id());
    listed |= d.id() == held;
  }
  if (!listed) {
    ids.resize(std::min<size_t>(ids.size(), 4));
    return Fail(
        absl::StrCat("the running pod's device ", held, " is gone after the plugin restarted"),
        absl::StrCat("listed [", absl::StrJoin(ids, ", "),
                     ids.size() == 4 ? ", ...]" : "]", " after its restart; before it, ", held,
                     " was listed and allocated to a running pod"),
        "a device keeps its ID while it exists: the kubelet's checkpoint holds the IDs of "
        "running pods' devices and never gives them out again",
        "the kubelet counts a device that no longer exists as in use and hands the same "
        "hardware to another pod; after a kubelet restart the running pod fails "
        "re-admission");
  }
  sim::ReadmitResponse re = c.kubelet().Readmit();
  for (const sim::ReadmitResult& res : re.results()) {
    if (!res.admitted()) {
      return Fail(absl::StrCat("the running pod was not re-admitted: ", res.message()), "", "",
                  "");
    }
  }
  if (Problem p2; !Admit(c, "after", {{c.resource(), 1}}, &p2).ok()) {
    return FromProblem("plugin-restart", p2);
  }
  return Pass(absl::StrCat("the running pod keeps ", held, "; new pods are admitted"), notes);
}

// A kubelet that starts without its checkpoint (deleted, corrupt, or
// written by a release it cannot read: the kubelet's checkpoint/checkpoint.go
// across releases) forgets
// which devices its running pods hold and offers them to new pods
// (kubernetes#102880, #116125), while it re-admits the running pods
// against allocatable. The cell passes when the running pod survives
// re-admission, the free devices go to new pods, and the device it holds
// goes to none.
CellResult CheckpointLost(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("checkpoint-lost", *p);
  Problem problem;
  absl::StatusOr<sim::AllocateResponse> r = Admit(c, "running", {{c.resource(), 1}}, &problem);
  if (!r.ok()) return FromProblem("checkpoint-lost", problem);
  const std::string held = r->allocations(0).device_ids(0);
  c.kubelet().Stop();
  if (::unlink(c.kubelet().checkpoint_path().c_str()) != 0) {
    return Fail(absl::StrCat("dpconform could not remove the kubelet's checkpoint: ",
                             ErrnoText(errno)),
                "", "", "");
  }
  const size_t from = c.events().Size();
  if (absl::Status s = c.kubelet().Start(); !s.ok()) {
    return Fail(absl::StrCat("dpconform could not start its kubelet again: ", s.message()), "",
                "", "");
  }
  if (auto p = c.Reach(Stage::kDevices, c.resource(), from)) {
    CellResult blocked;
    blocked.outcome = Outcome::kBlocked;
    blocked.blocked_by = "kubelet-restart";
    blocked.summary = absl::StrCat("not reached: after the kubelet restarted, ", p->summary);
    return blocked;
  }
  // The kubelet re-admits its running pods about a second after it starts,
  // against allocatable: a held device reported Unhealthy then gets the
  // running pod denied and killed (observed on a 1.36.2 node).
  if (!c.kubelet().WaitForPodsSynced(c.options().timeout)) {
    return Fail("the kubelet did not re-admit its pods within the timeout", "", "", "");
  }
  const sim::State synced = c.kubelet().GetState();
  for (const sim::PodState& p : synced.pods()) {
    if (p.name() != "running" || p.phase() == "Running") continue;
    return Fail(absl::StrCat("the running pod was denied when the kubelet re-admitted it: ",
                             p.message()),
                absl::StrCat("reported ", held,
                             " Unhealthy (or no devices) while the kubelet re-admitted its "
                             "running pods"),
                "a restarted kubelet re-admits every running pod against allocatable "
                "(healthy devices); a held device must keep its health",
                "running pods killed after a kubelet restart");
  }
  int healthy = 0;
  for (const sim::DeviceState& d : c.Devices(c.resource())) healthy += d.health() == "Healthy";
  const std::string handed_out_twice =
      "nothing: a kubelet that cannot read its checkpoint (deleted, corrupt, or from a release "
      "it cannot read) forgets its running pods' devices and offers them again; only the "
      "plugin side can keep new pods off them (steer GetPreferredAllocation away, refuse an "
      "Allocate of a held device), as dpproxy with a state directory does";
  const std::string users = "two pods on one device after a kubelet restart or upgrade: wrong "
                            "results, out-of-memory errors, or data of one pod seen by another";
  auto gets_held = [&](const sim::AllocateResponse& r) {
    for (const auto& a : r.allocations()) {
      for (const std::string& id : a.device_ids()) {
        if (id == held) return true;
      }
    }
    return false;
  };
  // Every other device can go to new pods, and none of them is the held one.
  if (healthy > 1) {
    absl::StatusOr<sim::AllocateResponse> next =
        Admit(c, "next", {{c.resource(), healthy - 1}}, &problem);
    if (!next.ok()) {
      return Fail(absl::StrCat("a new pod asking for the ", healthy - 1,
                               " free device(s) was refused: ", problem.summary),
                  problem.plugin_did, "the free devices go to new pods",
                  "pods failing on a node with room");
    }
    if (gets_held(*next)) {
      return Fail(absl::StrCat("device ", held, " was handed to a new pod while a running pod "
                               "holds it (", healthy - 1, " other device(s) were free)"),
                  absl::StrCat("left ", held, " to the kubelet's choice"), handed_out_twice,
                  users);
    }
  }
  // One more: only the held device is left.
  absl::StatusOr<sim::AllocateResponse> more = Admit(c, "more", {{c.resource(), 1}}, &problem);
  if (more.ok() && gets_held(*more)) {
    return Fail(absl::StrCat("device ", held, " was handed to a new pod while a running pod "
                             "holds it"),
                absl::StrCat("answered an Allocate of ", held,
                             " after the kubelet restarted without its checkpoint"),
                handed_out_twice, users);
  }
  return Pass(absl::StrCat("the running pod kept ", held, " and its place; ",
                           healthy > 1 ? "the other devices went to new pods, " : "",
                           "no new pod got ", held));
}

// A DaemonSet rolling update with maxSurge: the new instance registers
// while the old one runs, then the old one exits. 1.9-1.24 stop the
// replaced client at once, so its end changes nothing; 1.25-1.36 keep it and,
// when its stream ends, disconnect whatever client holds the resource name
// (kubernetes#121994): allocatable drops to 0. A
// kubelet that tracks clients per socket (#135437, --per_socket_clients)
// disconnects only a client at the ended one's socket: unique socket names
// per instance keep the registration.
CellResult RollingUpdate(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("rolling-update", *p);
  const size_t from = c.events().Size();
  if (absl::Status s = c.StartSecondInstance(); !s.ok()) {
    return Fail(absl::StrCat("dpconform could not start a second instance: ", s.message()), "",
                "", "");
  }
  std::optional<Json> second = c.events().WaitForEvent(
      "register_request", {{"resource", c.resource()}}, c.options().timeout, from);
  if (!second.has_value()) {
    return Fail("the second instance never registered while the first ran",
                absl::StrCat("started a second instance ({instance}=2) that did not call "
                             "Register within ",
                             absl::FormatDuration(c.options().timeout)),
                "a new instance of a DaemonSet registers while the old one still runs "
                "(maxSurge) and takes the resource over",
                "a rolling update of the plugin leaves the old instance serving until it is "
                "killed, then nothing");
  }
  if (auto p = c.Reach(Stage::kDevices, c.resource(), from)) {
    return FromProblem("rolling-update", *p);
  }
  std::optional<Json> first =
      c.events().WaitForEvent("register_request", {{"resource", c.resource()}},
                              absl::ZeroDuration(), 0);
  const std::string old_endpoint = first.has_value() ? (*first)["endpoint"].get<std::string>()
                                                     : std::string();
  const std::string new_endpoint = (*second)["endpoint"].get<std::string>();
  const size_t before_stop = c.events().Size();
  const std::string ended = c.ReplaceByTheSecondInstance();
  // The kubelet's handling of the old client's end (at the replacement in
  // 1.9-1.24, when the old instance exits from 1.25): what it did decides.
  // With one socket name for both, only an end after the old instance
  // stopped is the old one's.
  c.events().WaitForEvent(
      "replaced_client_ended",
      {{"resource", c.resource()},
       {"endpoint", JoinPath(c.kubelet().device_plugin_dir(), old_endpoint)}},
      c.options().timeout, old_endpoint == new_endpoint ? before_stop : from);
  const std::vector<std::string> notes = {absl::StrCat("old instance stopped: ", ended),
                                          absl::StrCat("sockets: ", old_endpoint, " then ",
                                                       new_endpoint)};
  // Registered, connected and with devices, now or (after a plugin's own
  // recovery, e.g. re-registering when the old instance's exit removed a
  // shared socket file) within the timeout.
  auto kept_now = [&] {
    const sim::State state = c.kubelet().GetState();
    for (const sim::ResourceState& r : state.resources()) {
      if (r.name() == c.resource()) return r.connected() && r.allocatable() > 0;
    }
    return false;
  };
  const absl::Time deadline = absl::Now() + c.options().timeout;
  bool kept = false;
  for (;;) {
    const size_t seen = c.events().Size();  // before the look: no update missed
    kept = kept_now();
    if (kept || absl::Now() >= deadline) break;
    c.events().WaitForEvent("devices", {{"resource", c.resource()}}, deadline - absl::Now(),
                            seen);
  }
  if (kept) {
    return Pass("the new instance kept the resource after the old one exited", notes);
  }
  const bool shared = old_endpoint == new_endpoint;
  const bool per_socket = c.version().per_socket_clients;
  return Fail(
      absl::StrCat("the resource was disconnected when the old instance exited, and not back "
                   "within ",
                   absl::FormatDuration(c.options().timeout)),
      absl::StrCat("a second instance registered ", new_endpoint, " while the first (",
                   old_endpoint, ") ran; then the first exited",
                   shared ? ": both used the same socket name" : ""),
      per_socket
          ? "a kubelet that tracks clients per socket (kubernetes#135437) disconnects the "
            "client at the ended instance's socket: each instance needs a socket name of its "
            "own (the pod's name, or {instance})"
          : "1.25-1.36 disconnect whatever client holds the resource name when a replaced "
            "client's stream ends (kubernetes#121994): no plugin alone survives a maxSurge "
            "rolling update there; roll with maxUnavailable (old instance first), or run "
            "behind dpproxy, whose own registration does not change",
      "allocatable drops to 0 after a rolling update of the plugin's DaemonSet, until the "
      "plugin restarts; pods needing the resource stay Pending");
}

CellResult MultiResource(Cell& c) {
  const std::vector<std::string>& resources = c.options().resources;
  if (resources.size() < 2) return NotApplicable("one --resource given");
  // Registered and connected first: a shared socket shows in the
  // endpoints, before the servers' fight over it ends any stream.
  for (const std::string& r : resources) {
    if (auto p = c.Reach(Stage::kConnected, r)) {
      // The first resource's registration is the single-resource cells'
      // check; the others' are this cell's.
      if (r != resources.front() && (p->owner == "registers" || p->owner == "serves-first")) {
        p->owner = "multi-resource";
      }
      return FromProblem("multi-resource", *p);
    }
  }
  std::map<std::string, std::string> owner_of_endpoint;
  const sim::State state = c.kubelet().GetState();
  for (const sim::ResourceState& r : state.resources()) {
    auto [it, inserted] = owner_of_endpoint.emplace(r.endpoint(), r.name());
    if (!inserted) {
      return Fail(
          absl::StrCat(it->second, " and ", r.name(), " share the socket ", r.endpoint()),
          absl::StrCat("registered ", it->second, " and ", r.name(), " with the same endpoint"),
          "one socket per resource: the kubelet keeps one connection per resource and one "
          "plugin server answers on a socket",
          "one resource's calls reach the other resource's server: wrong devices in "
          "containers, or admission failures");
    }
  }
  for (const std::string& r : resources) {
    if (auto p = c.Reach(Stage::kDevices, r)) return FromProblem("multi-resource", *p);
  }
  std::vector<std::pair<std::string, int>> containers;
  for (const std::string& r : resources) containers.emplace_back(r, 1);
  Problem problem;
  if (!Admit(c, "multi", containers, &problem).ok()) return FromProblem("multi-resource", problem);
  return Pass(absl::StrCat(resources.size(), " resources from one process, each on its own "
                           "socket; a pod using all of them admitted"));
}

struct ScenarioEntry {
  ScenarioInfo info;
  CellResult (*run)(Cell&);
};

const std::vector<ScenarioEntry>& Entries() {
  static const auto* const kEntries = new std::vector<ScenarioEntry>{
      {{"registers", "registers",
        "A registration this kubelet accepts arrives (version, resource name, endpoint) and the "
        "kubelet connects: v1alpha2 on /deviceplugin.Registration for 1.9, v1beta1 on "
        "/v1beta1.Registration from 1.10, or a plugins_registry/ socket from 1.13."},
       Registers},
      {{"serves-first", "serves before registering",
        "The plugin's socket accepts connections when its Register arrives. From 1.25 the "
        "kubelet dials it inside Register and fails the call otherwise; older releases dial "
        "afterwards (noted, not failed)."},
       ServesFirst},
      {{"plugin-watcher", "plugin-watcher registration",
        "Where the plugin offers a socket in plugins_registry/ and the kubelet watches it "
        "(1.13+): GetInfo says DevicePlugin with supported versions, and the kubelet connects."},
       PluginWatcher},
      {{"device-list", "device list arrives",
        "ListAndWatch sends a list with at least one Healthy device (an empty first list gets "
        "3 s), and the stream stays open."},
       DeviceList},
      {{"list-size", "device list within 4 MiB",
        "The list fits the kubelet's gRPC receive limit (4 MiB, gRPC's default); the cell "
        "reports how much of it the list uses."},
       ListSize},
      {{"health", "health change propagates",
        "A device made Unhealthy, then Healthy (by --health_command) reaches the kubelet as a "
        "new full list on the same stream."},
       Health},
      {{"allocate", "Allocate, one container",
        "A pod with one container is admitted: one container response, absolute mount and "
        "device paths, and device access this release reads (cdi_devices alone is nothing "
        "before 1.28, or in 1.28-1.30 with the gate off)."},
       Allocate},
      {{"allocate-two", "Allocate, two containers",
        "A pod with two containers gets one Allocate each, and the two responses do not name "
        "the same device node or CDI device."},
       AllocateTwo},
      {{"preferred", "GetPreferredAllocation",
        "From 1.19, when offered: one container response with exactly allocation_size distinct "
        "available IDs."},
       Preferred},
      {{"prestart", "PreStartContainer",
        "When the plugin asks for it (from GetDevicePluginOptions in 1.25+, from "
        "RegisterRequest before): PreStartContainer succeeds before the container starts."},
       PreStart},
      {{"kubelet-restart", "re-registers after a kubelet restart",
        "The kubelet restarts, removing every socket in device-plugins/; the plugin registers "
        "again and its devices come back (the time it took is reported)."},
       KubeletRestart},
      {{"kubelet-crash", "re-registers after a kubelet crash, through a late cleanup",
        "Opt-in (name it in --scenarios): a stress beyond what any kubelet release is known to "
        "do. The kubelet is killed and comes back, and dpconform removes the sockets in "
        "device-plugins/ once more after the new kubelet.sock appeared, as the plugin's "
        "Register arrives (a real kubelet cleans up before it listens): the plugin serves its socket again and registers again.",
        true},
       KubeletCrash},
      {{"plugin-restart", "survives its own restart",
        "With a pod running, the plugin is stopped (SIGTERM) and started again: it registers "
        "again, the pod's device keeps its ID, the pod is re-admitted and new pods are too."},
       PluginRestart},
      {{"checkpoint-lost", "a kubelet without its checkpoint kills no running pod and hands out no device twice",
        "Opt-in (name it in --scenarios). With a pod running, the kubelet restarts without its "
        "checkpoint, as after a deletion, corruption or an upgrade across checkpoint layouts "
        "(1.19 to 1.20-1.21 or 1.31+): the kubelet forgets the pod's device and counts it "
        "free. The running pod must survive re-admission (the device keeps its health), the "
        "other devices must go to new pods, and no new pod may get the held one.",
        true},
       CheckpointLost},
      {{"rolling-update", "survives a rolling update with surge",
        "Opt-in (name it in --scenarios). A second instance ({instance}=2) registers while the "
        "first runs, then the first is stopped: the resource stays registered with devices. "
        "1.25-1.36 disconnect by resource name when the old stream ends (kubernetes#121994), "
        "so plain plugins fail there; with --per_socket_clients (#135437) instances with "
        "socket names of their own pass.",
        true},
       RollingUpdate},
      {{"multi-resource", "several resources from one process",
        "With two or more --resource: each registers with devices on its own socket, and a pod "
        "using all of them is admitted."},
       MultiResource},
  };
  return *kEntries;
}

const ScenarioEntry* FindScenario(const std::string& name) {
  for (const ScenarioEntry& e : Entries()) {
    if (name == e.info.name) return &e;
  }
  return nullptr;
}

CellResult RunCell(const ConformOptions& o, const sim::KubeletVersion& k,
                   const ScenarioEntry& scenario, const std::string& dir) {
  const absl::Time start = absl::Now();
  CellResult result;
  {
    Cell cell(o, k, dir);
    if (absl::Status s = cell.StartKubelet(); !s.ok()) {
      result = Fail(absl::StrCat("dpconform could not start its kubelet: ", s.message()), "", "",
                    "");
    } else if (absl::Status s = cell.StartPlugin(); !s.ok()) {
      result = Fail(absl::StrCat("could not start the plugin command: ", s.message()), "", "",
                    "");
    } else {
      result = scenario.run(cell);
    }
  }
  result.kubelet = k.name;
  result.generation = k.GenerationName();
  result.scenario = scenario.info.name;
  result.duration = absl::Now() - start;
  result.dir = dir;
  return result;
}

}  // namespace

CellResult Pass(std::string summary, std::vector<std::string> notes) {
  CellResult r;
  r.outcome = Outcome::kPass;
  r.summary = std::move(summary);
  r.notes = std::move(notes);
  return r;
}

CellResult NotApplicable(std::string why) {
  CellResult r;
  r.outcome = Outcome::kNotApplicable;
  r.summary = std::move(why);
  return r;
}

CellResult Fail(std::string summary, std::string did, std::string expects, std::string users) {
  CellResult r;
  r.outcome = Outcome::kFail;
  r.summary = std::move(summary);
  r.plugin_did = std::move(did);
  r.kubelet_expects = std::move(expects);
  r.users_see = std::move(users);
  return r;
}

std::string AdmissionOwner(const std::string& message) {
  if (absl::StrContains(message, "PreStartContainer")) return "prestart";
  if (absl::StrContains(message, "GetPreferredAllocation")) return "preferred";
  // The kubelet's own refusals, before any Allocate reaches the plugin:
  // what its device list showed at that moment.
  if (absl::StrContains(message, "has been stopped") ||
      absl::StrContains(message, "unavailable for") ||
      absl::StrContains(message, "no healthy devices present")) {
    return "device-list";
  }
  return "allocate";
}

absl::Status RunCommandToEnd(const ConformOptions& o, const std::string& flag,
                             const std::string& command,
                             const std::vector<std::pair<std::string, std::string>>& values,
                             const std::string& output_path, absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      StartCommand(o, command, values, output_path);
  if (!child.ok()) return child.status();
  std::optional<int> status = (*child)->Wait(timeout);
  if (!status.has_value()) {
    (*child)->Stop(o.stop_grace);
    return absl::DeadlineExceededError(absl::StrCat("--", flag, " did not end within ",
                                                    absl::FormatDuration(timeout)));
  }
  if (*status != 0) {
    absl::StatusOr<std::string> out = ReadFile(output_path);
    return absl::FailedPreconditionError(absl::StrCat(
        "--", flag, " ", ChildProcess::DescribeExit(*status), ": ",
        out.ok() && !out->empty() ? *out : std::string("(no output)")));
  }
  return absl::OkStatus();
}

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kPass: return "pass";
    case Outcome::kFail: return "fail";
    case Outcome::kBlocked: return "blocked";
    case Outcome::kNotApplicable: return "n/a";
  }
  return "?";
}

const std::vector<Placeholder>& Placeholders() {
  static const auto* const kPlaceholders = new std::vector<Placeholder>{
      {"kubelet_socket", "the kubelet's registration socket, <kubelet_root>/device-plugins/"
                         "kubelet.sock"},
      {"plugin_dir", "the device-plugins directory, where the plugin's socket goes"},
      {"kubelet_root", "the kubelet's root directory (/var/lib/kubelet on a node)"},
      {"plugins_registry", "the plugin watcher's directory, <kubelet_root>/plugins_registry"},
      {"work_dir", "a directory of the plugin's own for this cell, kept across its restarts "
                   "(state, control sockets)"},
      {"resource", "the first --resource"},
      {"kubelet_version", "the kubelet release this cell plays, e.g. 1.25"},
      {"instance", "1, or 2 for the new instance rolling-update starts while the old one "
                   "runs (unique socket names per instance: put it in the socket name)"},
  };
  return *kPlaceholders;
}

absl::StatusOr<std::string> Expand(
    const std::string& command, const std::vector<std::pair<std::string, std::string>>& values) {
  std::string out;
  size_t i = 0;
  while (i < command.size()) {
    const size_t open = command.find('{', i);
    if (open == std::string::npos) break;
    const size_t close = command.find('}', open);
    if (close == std::string::npos) break;
    const std::string name = command.substr(open + 1, close - open - 1);
    const bool is_name =
        !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
          return (ch >= 'a' && ch <= 'z') || ch == '_';
        });
    out.append(command, i, open - i);
    if (!is_name) {  // not a placeholder (a shell's ${VAR} or braces): kept
      out.append(command, open, close + 1 - open);
      i = close + 1;
      continue;
    }
    auto it = std::find_if(values.begin(), values.end(),
                           [&](const auto& kv) { return kv.first == name; });
    if (it == values.end()) {
      std::vector<std::string> known;
      for (const auto& kv : values) known.push_back(absl::StrCat("{", kv.first, "}"));
      return absl::InvalidArgumentError(absl::StrCat("unknown placeholder {", name,
                                                     "}; known: ", absl::StrJoin(known, " ")));
    }
    out += it->second;
    i = close + 1;
  }
  out.append(command, i, std::string::npos);
  return out;
}

const std::vector<ScenarioInfo>& Scenarios() {
  static const auto* const kInfos = [] {
    auto* v = new std::vector<ScenarioInfo>;
    for (const ScenarioEntry& e : Entries()) v->push_back(e.info);
    return v;
  }();
  return *kInfos;
}

std::vector<std::string> DefaultKubelets() {
  std::vector<std::string> out;
  for (const sim::KubeletGeneration& g : sim::KubeletGenerations()) {
    out.push_back(absl::StrCat("1.", g.last_minor));
  }
  return out;
}

absl::Status ValidateOptions(const ConformOptions& o) {
  if (absl::Status s = ValidateRealOptions(o); !s.ok()) return s;
  if (!o.dra_driver.empty()) return ValidateDraOptions(o);
  if (o.plugin_command.empty()) {
    return absl::InvalidArgumentError("--plugin: the plugin's command line is required");
  }
  // A cell's values, with placeholder-length stand-ins, to find unknown
  // placeholders before anything runs.
  std::vector<std::pair<std::string, std::string>> values;
  for (const Placeholder& p : Placeholders()) values.emplace_back(p.name, "x");
  if (absl::StatusOr<std::string> s = Expand(o.plugin_command, values); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--plugin: ", s.status().message()));
  }
  if (!o.health_command.empty()) {
    values.emplace_back("device", "x");
    values.emplace_back("health", "x");
    if (absl::StatusOr<std::string> s = Expand(o.health_command, values); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--health_command: ", s.status().message()));
    }
  }
  if (o.resources.empty()) {
    return absl::InvalidArgumentError("--resource: at least one resource name is required");
  }
  for (const std::string& s : o.scenarios) {
    if (FindScenario(s) == nullptr) {
      std::vector<std::string> names;
      for (const ScenarioEntry& e : Entries()) names.push_back(e.info.name);
      return absl::InvalidArgumentError(absl::StrCat("--scenarios: unknown scenario \"", s,
                                                     "\"; known: ", absl::StrJoin(names, ", ")));
    }
  }
  if (o.kubelets.empty() && o.real_kubelets.empty()) {
    return absl::InvalidArgumentError("--kubelets: no kubelet release");
  }
  if (o.jobs < 1 || o.jobs > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--jobs=", o.jobs, " must be 1 to 64"));
  }
  if (o.dial_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--dial_timeout must be positive");
  }
  if (o.timeout < o.dial_timeout + absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timeout=", absl::FormatDuration(o.timeout), " is too short: the kubelet takes up to ",
        absl::FormatDuration(o.dial_timeout),
        " (--dial_timeout) to give up dialling a plugin; allow at least a second more"));
  }
  // <root>/dpconform.XXXXXX/c9999/k/plugins_registry/<socket>: leave room
  // for the plugin's own socket name.
  if (o.work_root.size() > 40) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--work_dir=", o.work_root, " is too long (", o.work_root.size(),
        " bytes; at most 40): the sockets inside must stay within the 107-byte limit"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ChildProcess>> StartCommand(
    const ConformOptions& o, const std::string& command,
    const std::vector<std::pair<std::string, std::string>>& values,
    const std::string& output_path) {
  absl::StatusOr<std::string> expanded = Expand(command, values);
  if (!expanded.ok()) return expanded.status();
  ChildSpec spec;
  spec.argv = {"/bin/sh", "-c", *expanded};
  spec.output_path = output_path;
  spec.env = o.env;
  for (const auto& [name, value] : values) {
    spec.env.emplace_back(absl::StrCat("DPCONFORM_", absl::AsciiStrToUpper(name)), value);
  }
  return ChildProcess::Start(spec);
}

absl::StatusOr<std::vector<CellResult>> RunCells(
    const ConformOptions& o, size_t n,
    const std::function<CellResult(size_t, const std::string&)>& run) {
  if (absl::Status s = MakeDirs(o.work_root); !s.ok()) return s;
  std::string root = JoinPath(o.work_root, "dpconform.XXXXXX");
  if (::mkdtemp(root.data()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make a directory in ", o.work_root, ": ", ErrnoText(errno)));
  }
  std::vector<CellResult> results(n);
  std::atomic<size_t> next{0};
  absl::Mutex report_mu;
  size_t done = 0;  // under report_mu
  auto worker = [&] {
    for (size_t i = next++; i < n; i = next++) {
      const std::string dir = JoinPath(root, absl::StrCat("c", i));
      if (absl::Status s = MakeDirs(dir); !s.ok()) {
        results[i].outcome = Outcome::kFail;
        results[i].summary = std::string(s.message());
      } else {
        results[i] = run(i, dir);
      }
      const bool keep = o.keep || results[i].outcome == Outcome::kFail ||
                        results[i].outcome == Outcome::kBlocked;
      if (!keep) {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
        results[i].dir.clear();
      }
      absl::MutexLock lock(&report_mu);
      ++done;
      if (o.on_cell) o.on_cell(results[i], done, n);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < std::min<int>(o.jobs, static_cast<int>(n)); ++t) {
    threads.emplace_back(worker);
  }
  for (std::thread& t : threads) t.join();
  bool any_kept = std::any_of(results.begin(), results.end(),
                              [](const CellResult& r) { return !r.dir.empty(); });
  if (!any_kept) {
    std::error_code ignored;
    std::filesystem::remove_all(root, ignored);
  }
  return results;
}

void SettleBlocked(std::vector<CellResult>* results) {
  std::map<std::pair<std::string, std::string>, Outcome> outcome;
  for (const CellResult& r : *results) outcome[{r.kubelet, r.scenario}] = r.outcome;
  for (CellResult& r : *results) {
    if (r.outcome != Outcome::kBlocked) continue;
    auto it = outcome.find({r.kubelet, r.blocked_by});
    if (it != outcome.end() && it->second == Outcome::kFail) continue;
    // The check belongs to another scenario, but that scenario did not fail
    // in this release: what went wrong is this cell's own.
    r.outcome = Outcome::kFail;
    r.summary = absl::StrCat(
        r.summary, "; ", r.blocked_by,
        it == outcome.end() ? std::string(" was not run")
                            : absl::StrCat(" itself was ", OutcomeName(it->second)),
        " in kubelet ", r.kubelet, ", so this is this cell's own failure");
    r.blocked_by.clear();
  }
}

absl::StatusOr<std::vector<CellResult>> RunConformance(const ConformOptions& o) {
  if (!o.dra_driver.empty()) {
    absl::StatusOr<std::vector<CellResult>> results = RunDraConformance(o);
    if (results.ok()) SettleBlocked(&*results);
    return results;
  }
  if (absl::Status s = ValidateOptions(o); !s.ok()) return s;
  std::vector<const ScenarioEntry*> scenarios;
  if (o.scenarios.empty()) {
    for (const ScenarioEntry& e : Entries()) {
      if (!e.info.opt_in) scenarios.push_back(&e);
    }
  } else {
    for (const std::string& s : o.scenarios) scenarios.push_back(FindScenario(s));
  }
  // The real node first: a node that cannot be used says so before the
  // simulated cells take their time.
  absl::StatusOr<std::vector<CellResult>> real = RunRealConformance(o);
  if (!real.ok()) return real.status();
  std::vector<std::pair<const sim::KubeletVersion*, const ScenarioEntry*>> jobs;
  for (const sim::KubeletVersion& k : o.kubelets) {
    for (const ScenarioEntry* s : scenarios) jobs.emplace_back(&k, s);
  }
  absl::StatusOr<std::vector<CellResult>> results =
      jobs.empty() ? std::vector<CellResult>{}
                   : RunCells(o, jobs.size(), [&](size_t i, const std::string& dir) {
                       return RunCell(o, *jobs[i].first, *jobs[i].second, dir);
                     });
  if (!results.ok()) return results;
  results->insert(results->end(), real->begin(), real->end());
  SettleBlocked(&*results);
  return results;
}

}  // namespace dpproxy::conform
