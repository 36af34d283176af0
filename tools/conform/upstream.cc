#include "tools/conform/upstream.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dpproxy::conform {
namespace {

constexpr char kDp[] = "test/e2e_node/device_plugin_test.go";
constexpr char kFailures[] = "test/e2e_node/device_plugin_failures_test.go";
constexpr char kDra[] = "test/e2e_node/dra_test.go";
constexpr char kDraCluster[] = "test/e2e/dra/dra.go";

}  // namespace

const std::vector<UpstreamMapping>& UpstreamMappings() {
  static const auto* const kMappings = new std::vector<UpstreamMapping>{
      {"registers",
       {{kDp, "Can schedule a pod that requires a device"}},
       "part: upstream waits for the sample plugin's capacity before each test; dpconform "
       "checks the Register itself (version, resource name, endpoint) on every release"},
      {"serves-first",
       {{kFailures, "when GetDevicePluginOptions fails, device plugin will not be used"}},
       "part: both rest on the kubelet calling GetDevicePluginOptions inside Register "
       "(1.25+); dpconform checks that the plugin serves before it registers"},
      {"plugin-watcher", {},
       "the node e2e tests register device plugins at kubelet.sock only"},
      {"device-list",
       {{kFailures,
         "when ListAndWatch fails immediately, node allocatable will be set to zero and "
         "kubelet will not retry to list resources"},
        {kFailures,
         "when ListAndWatch fails after provisioning devices, node allocatable will be set "
         "to zero and kubelet will not retry to list resources"}},
       "same facts: a stream that ends leaves allocatable 0 and is never opened again "
       "without a new registration; dpconform checks the plugin keeps it open with a "
       "healthy device"},
      {"list-size", {},
       "the sample plugin lists two devices; the 4 MiB receive limit is "
       "gRPC's default in the kubelet's client"},
      {"list-growth", {}, "the sample plugin lists two devices and never changes the count"},
      {"health",
       {{kFailures,
         "will set allocatable to zero when a single device became unhealthy and then back "
         "to 1 if it got healthy again"},
        {kFailures,
         "will lower allocatable to a number of unhealthy devices and then back if they "
         "became healthy again"}},
       "same check, made on the plugin's own stream (--health_command) rather than a test "
       "plugin's"},
      {"allocate",
       {{kDp, "Can schedule a pod that requires a device"},
        {kDp, "can make a CDI device accessible in a container"}},
       "same check, with each release's reading of the answer (cdi_devices from 1.28 with "
       "the gate)"},
      {"allocate-two",
       {{kDp, "Can schedule a pod with a restartable init container"}},
       "part: upstream checks that two containers get different devices; dpconform also "
       "checks that no container's answer names another's device"},
      {"preferred", {},
       "not in the node e2e tests; the device manager's unit tests cover the kubelet's "
       "side"},
      {"prestart", {},
       "not in the node e2e tests; the device manager's unit tests cover the kubelet's "
       "side"},
      {"kubelet-restart",
       {{kDp,
         "Keeps device plugin assignments across kubelet restarts (no pod restart, no "
         "device plugin restart)"},
        {kDp,
         "Keeps device plugin assignments across pod and kubelet restarts (no device plugin "
         "restart)"}},
       "same check: the plugin registers again after the kubelet's start removed its "
       "socket, and the running pod keeps its device"},
      {"kubelet-crash", {},
       "a stress beyond what any kubelet release is known to do"},
      {"plugin-restart",
       {{kDp,
         "Keeps device plugin assignments after the device plugin has restarted (no kubelet "
         "restart, pod restart)"},
        {kDp,
         "Keeps device plugin assignments after kubelet restart and device plugin restart "
         "(no pod restart)"}},
       "same check, and dpconform also requires the held device to keep its ID"},
      {"allocate-restart",
       {{kFailures,
         "when device plugin is stopped after provisioning devices, node allocatable will be "
         "set to zero"}},
       "part: upstream stops the plugin between calls; dpconform kills it with an Allocate in "
       "flight and requires it to come back and allocate the same device"},
      {"checkpoint-lost", {},
       "the closest, \"Keeps device plugin assignments across node reboots "
       "(no pod restart, no device plugin re-registration)\", keeps the checkpoint"},
      {"rolling-update", {},
       "not for device plugins: the plugin watcher's README supports seamless upgrades for "
       "DRA only"},
      {"multi-resource", {}, "the sample plugin serves one resource"},
      {"dra-registers",
       {{kDra, "must recover and register after registration failure"}},
       "part: every upstream DRA node test first waits for the test driver's registration; "
       "dpconform checks GetInfo (type, name, services) on every DRA release"},
      {"dra-publishes", {},
       "not in the node e2e tests; test/e2e/dra checks slices through a whole cluster"},
      {"dra-prepare",
       {{kDra, "must run pod if NodePrepareResources fails and then succeeds"},
        {kDra, "must call NodeUnprepareResources for deleted pod"}},
       "part: upstream runs a pod through prepare and unprepare; dpconform checks the "
       "answer's devices and CDI names and that unprepare succeeds twice"},
      {"dra-several-requests", {},
       "no node e2e test of a claim with several requests in test/e2e_node/dra_test.go"},
      {"dra-beside-device-plugin",
       {{kDraCluster, "supports extended resources together with ResourceClaim"},
        {kDraCluster, "must prefer device plugin over DRA when both advertise the same "
                      "resource on a node"}},
       "part: upstream runs its e2e sample device plugin beside the DRA test driver, each with "
       "devices of its own, and checks how pods are scheduled; dpconform checks that a plugin "
       "and a driver for the same devices never give one to two pods"},
      {"dra-device-plugin-beside-claim",
       {{kDraCluster, "supports extended resources together with ResourceClaim"}},
       "part: as for dra-beside-device-plugin, in the other order"},
      {"dra-kubelet-restart",
       {{kDra, "must register after Kubelet restart"}},
       "same check, and dpconform also prepares the same claim again"},
      {"dra-driver-restart",
       {{kDra, "must register after plugin restart"}},
       "same check, and dpconform also prepares and unprepares a claim prepared before"},
      {"dra-health", {},
       "no node e2e test of the health stream (KEP-4680) in test/e2e_node/dra_test.go"},
      {"dra-unknown-claim", {},
       "the test driver is never asked for a claim the API server lacks"},
  };
  return *kMappings;
}

const UpstreamMapping* UpstreamOf(absl::string_view scenario) {
  for (const UpstreamMapping& m : UpstreamMappings()) {
    if (scenario == m.scenario) return &m;
  }
  return nullptr;
}

std::string UpstreamText(const UpstreamMapping& m) {
  if (m.tests.empty()) return "none upstream";
  return absl::StrJoin(m.tests, "; ", [](std::string* out, const UpstreamTest& t) {
    absl::StrAppend(out, t.file, ": \"", t.test, "\"");
  });
}

}  // namespace dpproxy::conform
