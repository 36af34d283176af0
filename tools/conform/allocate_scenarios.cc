// dpconform grid scenarios: allocation (grid_scenarios.h).
#include "tools/conform/grid_scenarios.h"


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
#include "tools/conform/dra.h"
#include "tools/conform/real.h"


namespace dpproxy::conform::grid {
namespace {

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

}  // namespace

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

}  // namespace dpproxy::conform::grid
