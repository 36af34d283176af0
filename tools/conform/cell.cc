#include "tools/conform/cell.h"

#include <algorithm>
#include <csignal>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "proxy/util/files.h"
#include "tools/kubelet_sim/kubelet_texts.h"

namespace dpproxy::conform {
namespace {

// How often a wait looks whether the plugin process is still there.
constexpr absl::Duration kProcessCheck = absl::Milliseconds(250);

bool IsFor(const Json& e, const std::string& resource) {
  return e.value("resource", "") == resource;
}

std::string Name(const Json& e) { return e.value("event", ""); }

std::string ExpectedRegistration(const sim::KubeletVersion& k) {
  if (k.personality == sim::Personality::kV1Alpha) {
    return "a plugin calls /deviceplugin.Registration/Register on <root>/device-plugins/"
           "kubelet.sock with version \"v1alpha2\" (1.9 speaks only v1alpha)";
  }
  return absl::StrCat(
      "a plugin calls /v1beta1.Registration/Register on <root>/device-plugins/kubelet.sock "
      "with version \"v1beta1\"",
      k.plugin_watcher ? ", or offers a socket in <root>/plugins_registry/" : "");
}

}  // namespace

CellResult FromProblem(const std::string& scenario, const Problem& p) {
  CellResult r;
  if (p.owner == scenario) {
    r.outcome = Outcome::kFail;
    r.summary = p.summary;
    r.plugin_did = p.plugin_did;
    r.kubelet_expects = p.kubelet_expects;
    r.users_see = p.users_see;
  } else {
    r.outcome = Outcome::kBlocked;
    r.blocked_by = p.owner;
    r.summary = absl::StrCat("not reached: ", p.owner, " failed (", p.summary, ")");
  }
  return r;
}

Cell::Cell(const ConformOptions& options, const sim::KubeletVersion& kubelet, std::string dir)
    : options_(options), version_(kubelet), dir_(std::move(dir)) {
  sim::KubeletSimOptions o;
  o.root_dir = JoinPath(dir_, "k");
  o.kubelet = version_;
  o.dial_timeout = options_.dial_timeout;
  sim_ = std::make_unique<sim::KubeletSim>(o);
}

Cell::~Cell() {
  if (second_ != nullptr) second_->Stop(options_.stop_grace);
  StopPlugin();
  sim_->Stop();
}

absl::Status Cell::StartKubelet() {
  if (absl::Status s = MakeDirs(JoinPath(dir_, "w")); !s.ok()) return s;
  if (absl::Status s = events().OpenFile(JoinPath(dir_, "kubelet.events.jsonl")); !s.ok()) {
    return s;
  }
  return sim_->Start();
}

std::vector<std::pair<std::string, std::string>> Cell::Values(
    std::vector<std::pair<std::string, std::string>> extra) const {
  std::vector<std::pair<std::string, std::string>> v = {
      {"kubelet_socket", sim_->kubelet_socket()},
      {"plugin_dir", sim_->device_plugin_dir()},
      {"kubelet_root", JoinPath(dir_, "k")},
      {"plugins_registry", sim_->plugins_registry_dir()},
      {"work_dir", JoinPath(dir_, "w")},
      {"resource", resource()},
      {"kubelet_version", version_.name},
  };
  if (std::none_of(extra.begin(), extra.end(), [](const auto& e) { return e.first == "instance"; })) {
    v.emplace_back("instance", "1");
  }
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> Cell::StartInstance(int instance) {
  return StartCommand(
      options_, options_.plugin_command, Values({{"instance", absl::StrCat(instance)}}),
      JoinPath(dir_, instance == 1 ? "plugin.log" : absl::StrCat("plugin-", instance, ".log")));
}

absl::Status Cell::StartPlugin() {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = StartInstance(1);
  if (!child.ok()) return child.status();
  plugin_ = *std::move(child);
  plugin_ended_.clear();
  return absl::OkStatus();
}

absl::Status Cell::StartSecondInstance() {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = StartInstance(2);
  if (!child.ok()) return child.status();
  second_ = *std::move(child);
  return absl::OkStatus();
}

std::string Cell::ReplaceByTheSecondInstance() {
  const std::string ended = StopPlugin();
  plugin_ = std::move(second_);
  return ended;
}

std::string Cell::StopPlugin() {
  if (plugin_ == nullptr) return plugin_ended_;
  plugin_ended_ = ChildProcess::DescribeExit(plugin_->Stop(options_.stop_grace));
  plugin_.reset();
  return plugin_ended_;
}

bool Cell::FreezePlugin() {
  return plugin_ != nullptr && plugin_->Freeze(options_.timeout);
}

std::string Cell::KillPlugin() {
  if (plugin_ == nullptr) return plugin_ended_;
  plugin_ended_ = ChildProcess::DescribeExit(plugin_->Kill());
  plugin_.reset();
  return plugin_ended_;
}

bool Cell::PluginRunning() {
  if (plugin_ == nullptr) return false;
  if (plugin_->Running()) return true;
  plugin_ended_ = ChildProcess::DescribeExit(*plugin_->Wait(absl::ZeroDuration()));
  return false;
}

std::string Cell::PluginOutputTail(int lines) const {
  // The last 64 KiB at most: the log may be as large as a plugin wrote.
  absl::StatusOr<std::string> out = ReadFileTail(JoinPath(dir_, "plugin.log"), 64 << 10);
  if (!out.ok() || out->empty()) return "(no output)";
  std::vector<std::string> all = absl::StrSplit(*out, '\n', absl::SkipEmpty());
  const size_t first = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  std::vector<std::string> tail(all.begin() + static_cast<long>(first), all.end());
  return absl::StrJoin(tail, " | ");
}

absl::Status Cell::SetHealth(const std::string& device, const std::string& health) {
  return RunCommandToEnd(options_, "health_command", options_.health_command,
                         Values({{"device", device}, {"health", health}}),
                         JoinPath(dir_, "health_command.log"), options_.timeout);
}

absl::Status Cell::Grow(int64_t count) {
  return RunCommandToEnd(options_, "grow_command", options_.grow_command,
                         Values({{"count", absl::StrCat(count)}}),
                         JoinPath(dir_, "grow_command.log"), options_.timeout);
}

std::vector<sim::DeviceState> Cell::Devices(const std::string& resource) {
  sim::State st = sim_->GetState();
  for (const sim::ResourceState& r : st.resources()) {
    if (r.name() == resource) return {r.devices().begin(), r.devices().end()};
  }
  return {};
}

std::optional<Problem> Cell::Reach(Stage stage, const std::string& resource, size_t from,
                                   bool tolerate_rejections) {
  waited_ = first_wait_.value_or(options_.timeout);
  first_wait_.reset();
  const absl::Time deadline = absl::Now() + waited_;
  bool connected = false;
  int64_t healthy = -1;  // allocatable in the latest list; -1: no list yet
  std::optional<Json> failure;
  std::vector<Json> seen;
  std::optional<absl::Time> empty_since, unknown_since;
  auto reached = [&] {
    return connected && (stage == Stage::kConnected || healthy >= 1);
  };
  // Takes one event into account, once.
  auto process = [&](const Json& e) {
    seen.push_back(e);
    const std::string n = Name(e);
    if (n == "plugin_connected" && IsFor(e, resource)) connected = true;
    if (n == "devices" && IsFor(e, resource)) {
      healthy = e.value("allocatable", int64_t{0});
      if (healthy < 1 && !empty_since.has_value()) empty_since = absl::Now();
      if (healthy >= 1) empty_since.reset();
    }
    // A Register of an API this kubelet does not serve: a plugin that
    // tries versions in turn (dpproxy does) gets a short while to find the
    // right one.
    if (n == "unknown_call" && absl::StrContains(e.value("method", ""), "Register") &&
        !unknown_since.has_value()) {
      unknown_since = absl::Now();
    }
    // A loss before this window's connection is the previous plugin's.
    const bool decisive =
        ((n == "registration_rejected" || n == "plugin_dial_failed" ||
          (n == "plugin_lost" && connected)) &&
         IsFor(e, resource)) ||
        (n == "registration_rejected" && e.value("via", "") == "plugin-watcher") ||
        n == "watcher_registration_failed";
    if (decisive && !tolerate_rejections && !failure.has_value()) failure = e;
  };
  size_t next = from;
  for (;;) {
    for (const Json& e : events().Since(next)) {
      ++next;
      process(e);
      if (reached() || failure.has_value()) break;
    }
    if (reached() || failure.has_value()) break;
    absl::Time limit = deadline;
    if (empty_since.has_value() && connected) limit = std::min(limit, *empty_since + options_.settle);
    if (unknown_since.has_value() && !connected) {
      limit = std::min(limit, *unknown_since + options_.settle);
    }
    const absl::Duration left = limit - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    // Wakes at the next event, or to look at the plugin process.
    const bool more = events()
                          .WaitFor([](const Json&) { return true; },
                                   std::min(left, kProcessCheck), next)
                          .has_value();
    if (!more && !PluginRunning()) break;
  }
  if (reached()) return std::nullopt;
  return Diagnose(resource, seen);
}

Problem Cell::Diagnose(const std::string& resource, const std::vector<Json>& seen) {
  const std::string t = absl::FormatDuration(waited_);
  std::optional<Json> request, rejected, dial_failed, watcher_failed, lost, last_list, unknown;
  std::vector<std::string> other_resources;
  bool connected = false;
  for (const Json& e : seen) {
    const std::string n = Name(e);
    if (n == "register_request") {
      if (IsFor(e, resource)) {
        request = e;
      } else {
        other_resources.push_back(e.value("resource", ""));
      }
    }
    if (n == "registration_rejected" &&
        (IsFor(e, resource) || e.value("via", "") == "plugin-watcher")) {
      rejected = e;
    }
    if (n == "plugin_dial_failed" && IsFor(e, resource)) dial_failed = e;
    if (n == "unknown_call" && absl::StrContains(e.value("method", ""), "Register")) unknown = e;
    if (n == "watcher_registration_failed") watcher_failed = e;
    if (n == "plugin_lost" && IsFor(e, resource) && connected) lost = e;
    if (n == "plugin_connected" && IsFor(e, resource)) connected = true;
    if (n == "devices" && IsFor(e, resource)) last_list = e;
  }
  // Whether a start-up cleanup removed the socket the last Register named.
  bool cleaned_endpoint = false;
  if (request.has_value()) {
    const std::string endpoint = request->value("endpoint", "");
    for (const Json& e : seen) {
      if (Name(e) != "directory_cleaned" || !e.contains("removed")) continue;
      for (const Json& r : e["removed"]) {
        if (r.is_string() && !endpoint.empty() && absl::EndsWith(endpoint, r.get<std::string>())) {
          cleaned_endpoint = true;
        }
      }
    }
  }
  Problem p;
  const bool exited = !PluginRunning();
  std::string exit_note =
      exited ? absl::StrCat("; the plugin ", plugin_ended_, ", its output ends: ",
                            PluginOutputTail())
             : "";
  if (exited && absl::StrContains(plugin_ended_, absl::StrCat("signal ", SIGXFSZ, " "))) {
    absl::StrAppend(&exit_note, " (it wrote ", kMaxPluginOutputBytes >> 20,
                    " MiB, dpconform's limit for its output: a plugin that floods its log "
                    "fills a node's disk)");
  }

  if (lost.has_value() && absl::StrContains(lost->value("reason", ""), "RESOURCE_EXHAUSTED")) {
    p.owner = "list-size";
    p.summary = "the device list is over the kubelet's 4 MiB receive limit";
    p.plugin_did = absl::StrCat("sent a ListAndWatch response the kubelet could not receive (",
                                lost->value("reason", ""), ")");
    p.kubelet_expects =
        "every ListAndWatchResponse within 4 MiB: the kubelet's gRPC client keeps the default "
        "receive limit";
    p.users_see = "the kubelet drops the stream and marks every device unhealthy: allocatable 0";
    return p;
  }
  if (rejected.has_value() && rejected->value("via", "") == "plugin-watcher") {
    p.owner = "plugin-watcher";
    p.summary = absl::StrCat("the plugin-watcher registration was refused: ",
                             rejected->value("error", ""));
    p.plugin_did = absl::StrCat("offered socket ", rejected->value("socket", ""),
                                " whose GetInfo or endpoint the kubelet refused");
    p.kubelet_expects = "GetInfo answers type \"DevicePlugin\", the resource name, the endpoint "
                        "and supported versions including \"v1beta1\"";
    p.users_see = absl::StrCat("the kubelet logs \"", rejected->value("error", ""),
                               "\" and the resource never appears");
    return p;
  }
  if (watcher_failed.has_value()) {
    p.owner = "plugin-watcher";
    p.summary = watcher_failed->value("error", "");
    p.plugin_did = absl::StrCat("offered socket ", watcher_failed->value("socket", ""),
                                " in plugins_registry/ that did not answer GetInfo");
    p.kubelet_expects = "the socket serves pluginregistration.Registration (GetInfo, "
                        "NotifyRegistrationStatus)";
    p.users_see = "the kubelet logs the failure and the resource never appears";
    return p;
  }
  if (rejected.has_value()) {
    const std::string err = rejected->value("error", "");
    const bool dial = absl::StrContains(err, "failed to dial") ||
                      absl::StrContains(err, "failed to get device plugin options");
    if (dial && request.has_value() && !request->value("endpoint_listening", true) &&
        cleaned_endpoint) {
      // It served, and the kubelet's start-up cleanup removed the socket
      // (as a real kubelet's does, before it listens): not registering
      // before serving, but not serving again.
      p.owner = "kubelet-restart";
      p.summary = absl::StrCat("its socket ", request->value("endpoint", ""),
                               " was removed by the kubelet's start-up cleanup, and it "
                               "registered without serving it again");
      p.plugin_did = absl::StrCat("served ", request->value("endpoint", ""),
                                  " before the kubelet started, then called Register naming it "
                                  "after the cleanup had removed it, and did not serve it again "
                                  "within ", t);
      p.kubelet_expects = "a kubelet start removes every socket in device-plugins/ before it "
                          "listens; a plugin serves its socket again (watching it, or "
                          "kubelet.sock) before it registers";
      p.users_see = absl::StrCat("Register fails (\"", err,
                                 "\") and the resource stays away until the plugin restarts");
      return p;
    }
    if (dial && request.has_value() && !request->value("endpoint_listening", true)) {
      p.owner = "serves-first";
      p.summary = "called Register before serving its socket";
      p.plugin_did = absl::StrCat("called Register naming endpoint ",
                                  request->value("endpoint", ""),
                                  " while nothing accepted connections there");
      p.kubelet_expects = "from 1.25 the kubelet dials the plugin inside Register (10 s) and "
                          "asks for its options before answering";
      p.users_see = absl::StrCat("Register fails (\"", err,
                                 "\") and the resource never appears unless the plugin "
                                 "registers again");
      return p;
    }
    p.owner = "registers";
    p.summary = absl::StrCat("the kubelet refused Register: ", err);
    p.plugin_did = request.has_value()
                       ? absl::StrCat("called Register with version \"",
                                      request->value("version", ""), "\", resource \"",
                                      resource, "\", endpoint \"",
                                      request->value("endpoint", ""), "\"")
                       : "called Register";
    p.kubelet_expects = ExpectedRegistration(version_);
    p.users_see = absl::StrCat("the kubelet answers \"", err,
                               "\" and the resource never appears");
    return p;
  }
  if (unknown.has_value() && !connected) {
    p.owner = "registers";
    p.plugin_did = absl::StrCat("called ", unknown->value("method", ""), " on kubelet.sock");
    p.summary = absl::StrCat("called ", unknown->value("method", ""), ", which kubelet ",
                             version_.name, " does not serve");
    p.kubelet_expects = ExpectedRegistration(version_);
    p.users_see = absl::StrCat("the call fails (Unimplemented: ", unknown->value("error", ""),
                               ") and the resource never appears; a plugin of another API "
                               "version needs a bridge such as dpproxy");
    return p;
  }
  if (dial_failed.has_value()) {
    p.owner = "registers";
    p.summary = absl::StrCat("the kubelet could not reach the endpoint it was given: ",
                             dial_failed->value("error", ""));
    p.plugin_did = absl::StrCat("registered endpoint ", dial_failed->value("endpoint", ""),
                                ", which did not accept connections within ",
                                absl::FormatDuration(options_.dial_timeout));
    p.kubelet_expects = "1.9-1.24 dial the endpoint after Register returns, for up to 10 s";
    p.users_see = "Register succeeded, yet the resource never appears: the kubelet only "
                  "logs the failed dial";
    return p;
  }
  if (!connected) {
    p.owner = "registers";
    if (!other_resources.empty() && !request.has_value()) {
      p.summary = absl::StrCat("registered ", other_resources.front(), ", not ", resource);
      p.plugin_did = absl::StrCat("registered resource \"", other_resources.front(), "\"");
      p.kubelet_expects = absl::StrCat("the resource given to dpconform (--resource=",
                                       resource, ")");
      p.users_see = absl::StrCat("pods asking for ", resource, " stay Pending");
      return p;
    }
    const std::vector<std::string> watcher_sockets = ListSockets(sim_->plugins_registry_dir());
    if (!request.has_value() && !watcher_sockets.empty() && !version_.plugin_watcher) {
      p.summary = absl::StrCat("offers only a plugin-watcher socket, which kubelet ",
                               version_.name, " does not watch");
      p.plugin_did = absl::StrCat("created ", watcher_sockets.front(),
                                  " in plugins_registry/ and did not call Register");
      p.kubelet_expects = absl::StrCat(
          ExpectedRegistration(version_),
          "; the plugin watcher exists from 1.13 (device plugins through it from 1.13)");
      p.users_see = "the resource never appears";
      return p;
    }
    p.summary = request.has_value()
                    ? absl::StrCat("Register arrived but the kubelet never connected within ", t)
                    : exited ? "the plugin exited without registering"
                             : absl::StrCat("no registration this kubelet understands within ", t);
    p.plugin_did = request.has_value() ? "called Register; no ListAndWatch stream followed"
                                       : "did not register (no Register call arrived on "
                                         "kubelet.sock, no plugin-watcher socket appeared)";
    p.plugin_did += exit_note;
    if (!request.has_value() && !exited &&
        PathExists(JoinPath(sim_->device_plugin_dir(), std::string(sim::kDeprecationMarkerName)))) {
      // Plugins built on the kubelet's own stub (its e2e sample plugin)
      // register nowhere where they find the marker.
      p.plugin_did += absl::StrCat(
          "; device-plugins/", sim::kDeprecationMarkerName, " exists on this release, as a "
          "real ", version_.name, " kubelet leaves it (1.13-1.24), and a plugin built on the "
          "kubelet's device-plugin stub skips its kubelet.sock registration where it finds it");
    }
    p.kubelet_expects = ExpectedRegistration(version_);
    p.users_see = "the resource never appears on the node";
    return p;
  }
  if (lost.has_value()) {
    p.owner = "device-list";
    p.summary = absl::StrCat("the ListAndWatch stream ended: ", lost->value("reason", ""));
    p.plugin_did = absl::StrCat("ended its ListAndWatch stream (", lost->value("reason", ""),
                                ")", exit_note);
    p.kubelet_expects = "one ListAndWatch stream for the plugin's whole life, a full list on "
                        "every change";
    p.users_see = "the kubelet marks every device unhealthy (allocatable 0) until the plugin "
                  "registers again";
    return p;
  }
  p.owner = "device-list";
  if (!last_list.has_value()) {
    p.summary = absl::StrCat("no device list within ", t);
    p.plugin_did = absl::StrCat("accepted ListAndWatch but sent no list", exit_note);
  } else {
    const size_t n = last_list->contains("devices") ? (*last_list)["devices"].size() : 0;
    p.summary = n == 0 ? "the device list is empty"
                       : absl::StrCat("none of the ", n, " devices is healthy");
    p.plugin_did = n == 0 ? "sent a device list with no devices"
                          : absl::StrCat("listed ", n, " devices, none \"Healthy\"");
    p.plugin_did += exit_note;
  }
  p.kubelet_expects = "a first ListAndWatchResponse with the plugin's devices, health "
                      "\"Healthy\" for usable ones";
  p.users_see = "capacity or allocatable 0: pods asking for the resource stay Pending";
  return p;
}

}  // namespace dpproxy::conform
