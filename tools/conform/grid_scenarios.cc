// dpconform grid scenarios: registration, the device list and health
// (grid_scenarios.h).
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


}  // namespace

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

// The size of `devices` as one v1beta1 ListAndWatchResponse on the wire.
int64_t ListBytes(const std::vector<sim::DeviceState>& devices) {
  v1beta1::ListAndWatchResponse list;
  for (const sim::DeviceState& d : devices) {
    v1beta1::Device* out = list.add_devices();
    out->set_id(d.id());
    out->set_health(d.health());
    for (int64_t n : d.numa_nodes()) out->mutable_topology()->add_nodes()->set_id(n);
  }
  return static_cast<int64_t>(list.ByteSizeLong());
}

CellResult ListSize(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("list-size", *p);
  const std::vector<sim::DeviceState> devices = c.Devices(c.resource());
  const int64_t bytes = ListBytes(devices);
  return Pass(absl::StrFormat("%d devices in %.1f KiB: %.2f%% of the kubelet's 4 MiB limit",
                              devices.size(), bytes / 1024.0,
                              100.0 * static_cast<double>(bytes) / kKubeletReceiveLimit));
}

// A list that grows, as hardware is plugged in or a partitioning (MIG,
// vGPU) multiplies the devices: the plugin (told by --grow_command) lists
// twice its devices, which must reach the kubelet on the same stream, then
// enough for a quarter over the kubelet's 4 MiB. Every list is sent whole
// and the kubelet's client takes at most 4 MiB (gRPC's default): a larger
// one ends the stream (RESOURCE_EXHAUSTED), every device turns unhealthy,
// and nothing changes until the plugin registers again. The cell passes if
// the kubelet keeps healthy devices on a live stream: the plugin kept its
// list within the limit (capped it, shortened its IDs), or registered
// again with a list that fits.
CellResult ListGrowth(Cell& c) {
  if (c.options().grow_command.empty()) {
    return NotApplicable("no --grow_command: dpconform cannot make the plugin list more devices");
  }
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("list-growth", *p);
  auto harness = [](const absl::Status& s) {
    return Fail(absl::StrCat("the grow command failed: ", s.message()),
                "(the test harness, not the plugin: --grow_command failed)",
                "a way to change how many devices the plugin lists",
                "nothing: fix --grow_command");
  };
  // The first event from `from` on of the resource's stream ending, or of a
  // list whose device count (capacity) is `wanted`; nullopt: neither within
  // `wait`.
  auto next_list = [&](size_t from, absl::Duration wait,
                       const std::function<bool(int64_t)>& wanted) -> std::optional<Json> {
    return c.events().WaitFor(
        [&](const Json& j) {
          const std::string n = j.value("event", "");
          if (j.value("resource", "") != c.resource()) return false;
          if (n == "plugin_lost") return true;
          return n == "devices" && wanted(j.value("capacity", int64_t{0}));
        },
        wait, from);
  };
  const size_t before = c.Devices(c.resource()).size();
  const int64_t doubled = static_cast<int64_t>(before) * 2;
  size_t from = c.events().Size();
  if (absl::Status s = c.Grow(doubled); !s.ok()) return harness(s);
  std::optional<Json> e =
      next_list(from, c.options().timeout, [&](int64_t n) { return n == doubled; });
  if (!e.has_value() || e->value("event", "") == "plugin_lost") {
    return Fail(
        absl::StrCat("the kubelet never got the list of ", doubled, " devices"),
        e.has_value() ? absl::StrCat("was told to list ", doubled, " devices (from ", before,
                                     "); its stream ended: ", e->value("reason", ""))
                      : absl::StrCat("was told to list ", doubled, " devices (from ", before,
                                     "); no such list followed within ",
                                     absl::FormatDuration(c.options().timeout)),
        "a new full list on the open ListAndWatch stream at every change, more devices included",
        "new hardware never becomes allocatable until the plugin restarts");
  }
  const std::vector<sim::DeviceState> grown = c.Devices(c.resource());
  const double per_device =
      static_cast<double>(ListBytes(grown)) / static_cast<double>(std::max<size_t>(1, grown.size()));
  const int64_t target = std::max<int64_t>(
      doubled + 1, static_cast<int64_t>(1.25 * kKubeletReceiveLimit / per_device) + 1);
  std::vector<std::string> notes = {
      absl::StrCat(doubled, " devices reached the kubelet on the same stream"),
      absl::StrFormat("told to list %d devices (about %.1f MiB at the %.0f bytes a device of "
                      "the list of %d)",
                      target, target * per_device / (1 << 20), per_device, doubled)};
  from = c.events().Size();
  if (absl::Status s = c.Grow(target); !s.ok()) return harness(s);
  // The whole list arrives (it fits after all), the stream ends, or, when
  // the plugin keeps its list within the limit, nothing changes.
  e = next_list(from, c.options().settle + c.options().timeout / 2,
                [&](int64_t n) { return n == target; });
  if (e.has_value() && e->value("event", "") == "devices") {
    return Pass(absl::StrCat("all ", target, " devices reached the kubelet"), notes);
  }
  if (!e.has_value()) {
    const std::vector<sim::DeviceState> now = c.Devices(c.resource());
    const int64_t healthy = std::count_if(now.begin(), now.end(), [](const sim::DeviceState& d) {
      return d.health() == "Healthy";
    });
    if (healthy == 0) {
      return Fail("the kubelet has no healthy device after the list grew",
                  absl::StrCat("was told to list ", target, " devices; its stream stayed open "
                               "with no healthy device in it"),
                  "the devices that exist listed Healthy",
                  "allocatable 0: pods needing the resource stay Pending");
    }
    if (static_cast<int64_t>(now.size()) == target) {
      // The list arrived as the wait ended (a slow machine).
      return Pass(absl::StrCat("all ", target, " devices reached the kubelet"), notes);
    }
    notes.push_back(absl::StrFormat("the kubelet holds %d devices (%.1f MiB) on its stream",
                                    now.size(), ListBytes(now) / double(1 << 20)));
    return Pass(absl::StrCat("kept its list within the kubelet's limit: ", now.size(), " of ",
                             target, " devices listed"),
                notes);
  }
  const std::string reason = e->value("reason", "");
  const size_t lost = c.events().Size();
  const absl::Time start = absl::Now();
  if (!c.Reach(Stage::kDevices, c.resource(), lost, /*tolerate_rejections=*/true).has_value()) {
    notes.push_back(absl::StrCat("its stream ended (", reason, "); registered again with a list "
                                 "that fits in ", Ms(absl::Now() - start)));
    return Pass("registered again with a list within the limit after the stream ended", notes);
  }
  CellResult failed = Fail(
      absl::StrCat("a list of ", target, " devices ended the kubelet's stream"),
      absl::StrCat("sent the whole list on its stream as it grew past the kubelet's 4 MiB "
                   "receive limit (", reason, ") and did not register again with a list "
                   "that fits within ", absl::FormatDuration(c.options().timeout)),
      "every list within 4 MiB (gRPC's default, which the kubelet's client keeps): fewer "
      "devices per resource, shorter IDs, or no topology where it is the same for all; "
      "dpproxy in front shortens long IDs by itself when no pod holds a device",
      "every device of the resource turns unhealthy: allocatable 0, pods needing it stay "
      "Pending, until the plugin restarts (and fails again at the same size)");
  failed.notes = notes;
  return failed;
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

}  // namespace dpproxy::conform::grid
