// dpctl: inspect dpproxy's durable state. Reads the state file directly and
// never changes it, so it works while dpproxy is stopped (upgrade windows).
#include <algorithm>
#include <iostream>
#include <optional>
#include <string>

#include <gflags/gflags.h>
#include <nlohmann/json.hpp>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "proxy/cli/cli.h"
#include "proxy/util/files.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/state_dir.h"
#include "proxy/state/allocation_response.h"
#include "proxy/state/state_store.h"
#include "tools/dpctl/control_commands.h"

DEFINE_string(state_dir, "/var/lib/dpproxy", "dpproxy's --state_dir; the file is state.pb in it.");
DEFINE_string(output, "table", "table or json.");
DEFINE_string(reason, "",
              "cordon: why the device is taken out of service (one line, at most 1 KiB),\n"
              "shown in dpproxy status, its events and its log. Required.");
DEFINE_string(plugin_dir, "/var/lib/dpproxy/device-plugins",
              "dpproxy's --plugin_dir: its note there tells a state directory that lost\n"
              "every file (damage) from a new one (a first start).");

namespace dpproxy {
namespace {

// The state as JSON, each allocation's response as the message it is (the
// state holds it serialized; protobuf's JSON would print its bytes as
// base64).
std::string StateJson(const state::State& s) {
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  state::State without = s;
  for (state::Allocation& a : *without.mutable_allocations()) a.clear_response();
  std::string text;
  (void)google::protobuf::util::MessageToJsonString(without, &text, o);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded()) return text;
  for (int i = 0; i < s.allocations_size(); ++i) {
    if (s.allocations(i).response().empty()) continue;
    std::string r;
    (void)google::protobuf::util::MessageToJsonString(ResponseOf(s.allocations(i)), &r, o);
    j["allocations"][i]["response"] = nlohmann::ordered_json::parse(r, nullptr, false);
  }
  return j.dump(2);
}

constexpr char kUsage[] = R"(dpctl: inspect dpproxy's durable state, and take devices out of service.

Usage:
  dpctl state  [--state_dir=DIR] [--output=table|json]   resources, devices, allocations
  dpctl verify [--state_dir=DIR] [--plugin_dir=DIR]      exit 0 if the state is intact
  dpctl cordon RESOURCE DEVICE --reason=TEXT [--state_dir=DIR]
  dpctl uncordon RESOURCE DEVICE [--state_dir=DIR]
  dpctl cordons [--state_dir=DIR] [--output=table|json]

cordon takes a device out of service on the running dpproxy: the kubelet is
shown it Unhealthy (in DRA mode it leaves the pool) whatever its plugin
says, so no new pod gets it; a pod that holds it keeps running. The cordon
is kept in the state directory (cordons.json) across restarts, crashes and
takeovers until uncordon puts the device back. RESOURCE and DEVICE are as
the kubelet sees them (dpproxy status lists them). These three ask dpproxy
on <state_dir>/control.sock, which only root and dpproxy's own user may use;
each change is logged and an event, naming the caller's uid and pid.

The state (state.pb, the journal beside it, and their previous generation
state.pb.prev and journal.wal.prev) is read, never written. verify lists
every condition dpproxy would refuse to start on (an unreadable file, a
directory or a link in place of one) or repair at its next start (a snapshot
proven corrupt is moved aside and the previous generation loaded instead; a
torn journal tail is cut; damage in the journal, its header included, is
copied aside and the intact records kept; a journal missing beside a saved
snapshot is learned back from the kubelet) and exits 1 if there is any. A
state directory without any of its files is a first start if nothing says
it was used, and damage if dpproxy's note in the plugin directory names it
(dpproxy then learns back from the kubelet); both exit 1, saying which.
state prints what dpproxy would load, with the same conditions as warnings.

Flags:
)";

std::string Age(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  absl::Duration d = absl::Now() - absl::FromUnixMillis(unix_ms);
  if (d < absl::Seconds(1)) return "<1s";
  return absl::FormatDuration(absl::Trunc(d, absl::Seconds(1)));
}

void PrintTable(const std::string& path, const state::State& s) {
  std::cout << "state file " << path << ", saved "
            << (s.saved_unix_ms() > 0 ? Age(s.saved_unix_ms()) + " ago" : std::string("never"))
            << "\n\n";
  std::cout << absl::StrFormat("%-28s %-26s %-9s %-9s %s\n", "RESOURCE", "KUBELET API",
                               "BACKEND", "DEVICES", "BACKEND ENDPOINT");
  for (const state::Resource& r : s.resources()) {
    int healthy = 0;
    for (const auto& d : r.devices()) healthy += d.health() == kHealthy ? 1 : 0;
    std::cout << absl::StrFormat(
        "%-28s %-26s %-9s %-9s %s\n", r.name(),
        r.kubelet_api().empty() ? "(not registered)" : r.kubelet_api(),
        r.backend().api_version().empty() ? "-" : r.backend().api_version(),
        absl::StrFormat("%d/%d", healthy, r.devices_size()),
        r.backend().endpoint().empty() ? "-" : r.backend().endpoint());
  }
  std::cout << "\n" << s.allocations_size() << " allocation(s)\n";
  if (s.allocations_size() == 0) return;
  // PATH: how the kubelet was served the allocation (a pod of the
  // extended resource through the device plugin, or a DRA claim).
  std::cout << absl::StrFormat("%-6s %-24s %-30s %-14s %-32s %-9s %s\n", "ID", "RESOURCE",
                               "DEVICES", "PATH", "HOLDER", "BACKEND", "AGE");
  for (const state::Allocation& a : s.allocations()) {
    std::string holder = a.pod_name().empty()
                             ? std::string("(not yet reconciled)")
                             : absl::StrCat(a.pod_namespace(), "/", a.pod_name(), " / ",
                                            a.container());
    if (a.has_claim()) {
      holder = absl::StrCat("claim ", a.claim().namespace_(), "/", a.claim().name(), " / ",
                            a.claim().request());
    }
    // Held while the plugin is called; the kubelet has no answer yet.
    if (a.stage() == state::Allocation::RESERVED) absl::StrAppend(&holder, " [reserved]");
    std::cout << absl::StrFormat("%-6d %-24s %-30s %-14s %-32s %-9s %s\n", a.id(), a.resource(),
                                 absl::StrJoin(a.device_ids(), ",",
                                               [](std::string* out, const std::string& d) {
                                                 out->append(PrintableId(d));
                                               }),
                                 a.has_claim() ? "dra" : "device-plugin", holder,
                                 a.backend_api(), Age(a.allocated_unix_ms()));
  }
}

int Run(const std::string& command) {
  const std::string path = JoinPath(FLAGS_state_dir, "state.pb");
  if (StateDirEmpty(FLAGS_state_dir)) {
    const std::string note = JoinPath(FLAGS_plugin_dir, kStateNoteName);
    if (std::optional<std::string> since = StateDirNotedSince(FLAGS_plugin_dir, FLAGS_state_dir)) {
      std::cout << FLAGS_state_dir << ": not intact: every state file is gone, and dpproxy has "
                << "used this directory since " << *since << " (" << note
                << " names it): the state was lost; at its next start dpproxy says so and "
                << "learns back from the kubelet the allocations it lists\n";
      return 1;
    }
    std::cerr << "dpctl: no dpproxy state in " << FLAGS_state_dir << ", and " << note
              << " does not name it: dpproxy would start as on a first start (is --state_dir "
              << "right?)\n";
    return 1;
  }
  // The same inspection dpproxy's start-up makes, without changing anything.
  StateDirReport report = InspectStateDir(FLAGS_state_dir);
  if (command == "verify") {
    if (report.problems.empty()) {
      std::cout << FLAGS_state_dir << ": snapshot and journal intact, format "
                << kStateFormatVersion << ", " << report.state.resources_size()
                << " resource(s), " << report.state.allocations_size() << " allocation(s)\n";
      return 0;
    }
    std::cout << FLAGS_state_dir << ": not intact"
              << (report.refuses_start ? " (dpproxy refuses to start on it)" : "") << "\n";
    for (const std::string& p : report.problems) std::cout << "  - " << p << "\n";
    std::cout << "what dpproxy would load: " << report.state.resources_size()
              << " resource(s), " << report.state.allocations_size() << " allocation(s)\n";
    return 1;
  }
  for (const std::string& p : report.problems) std::cerr << "dpctl: warning: " << p << "\n";
  if (report.refuses_start) {
    std::cerr << "dpctl: the state in " << FLAGS_state_dir << " cannot be read\n";
    return 1;
  }
  const state::State& s = report.state;
  if (FLAGS_output == "json") {
    std::cout << StateJson(s) << "\n";
    return 0;
  }
  if (FLAGS_output != "table") {
    std::cerr << "dpctl: --output=" << FLAGS_output << " is not table or json\n";
    return 2;
  }
  PrintTable(path, s);
  return 0;
}

}  // namespace
}  // namespace dpproxy

namespace dpproxy {
namespace {

// Splits the command line into its flags (kept in argv, in order, for
// ParseFlags) and its positional arguments (the subcommand and its
// arguments), wherever each stands: `dpctl --state_dir=D cordon R D
// --reason X` and `dpctl cordon R D --state_dir D --reason=X` alike. A
// flag given as "--name value" takes the next argument as its value
// unless it is a boolean flag.
std::vector<std::string> TakePositional(int* argc, char** argv) {
  std::vector<std::string> positional;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      for (++i; i < *argc; ++i) positional.emplace_back(argv[i]);
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      positional.push_back(a);
      continue;
    }
    argv[kept++] = argv[i];
    if (a.find('=') != std::string::npos) continue;
    std::string name = a.substr(a.find_first_not_of('-'));
    std::replace(name.begin(), name.end(), '-', '_');
    gflags::CommandLineFlagInfo info;
    if (gflags::GetCommandLineFlagInfo(name.c_str(), &info) && info.type != "bool" &&
        i + 1 < *argc) {
      argv[kept++] = argv[++i];
    }
  }
  *argc = kept;
  return positional;
}

}  // namespace
}  // namespace dpproxy

int main(int argc, char** argv) {
  std::vector<std::string> args = dpproxy::TakePositional(&argc, argv);
  std::string command = "state";
  if (!args.empty()) {
    command = args.front();
    args.erase(args.begin());
  }
  if (dpproxy::WantsHelp(argc, argv) || command == "help") {
    std::cout << dpproxy::kUsage << dpproxy::FlagsHelp({"tools/dpctl/main.cc"});
    return 0;
  }
  const bool control = dpproxy::IsControlCommand(command);
  if (command != "state" && command != "verify" && !control) {
    std::cerr << "dpctl: unknown subcommand \"" << command << "\"; see dpctl --help\n";
    return 2;
  }
  if (!control && !args.empty()) {
    std::cerr << "dpctl " << command << ": unexpected argument \"" << args.front()
              << "\"; see dpctl --help\n";
    return 2;
  }
  if (!dpproxy::ParseFlags("dpctl", &argc, &argv)) return 2;
  if (control) {
    return dpproxy::RunControlCommand(command, args, FLAGS_state_dir, FLAGS_reason, FLAGS_output);
  }
  return dpproxy::Run(command);
}
