#include "proxy/config/config_file.h"

#include <sys/mount.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;

ProxyConfig Base() {
  ProxyConfig c;
  c.kubelet.kubelet_root = "/var/lib/kubelet";
  c.plugin_dir = "/var/lib/dpproxy/device-plugins";
  return c;
}

TEST(ConfigFileTest, FullFileIsApplied) {
  ProxyConfig c = Base();
  absl::Status s = LoadConfigText(R"(
kubelet:
  root: /var/snap/microk8s/common/var/lib/kubelet
  api: v1alpha
  registration: plugin-watcher
plugin_dir: /run/dpproxy/plugins
status_file: /run/dpproxy/status.json
socket_group: "0"
timeouts: {backend: 5s, dial: 2s}
limits: {backend_list_mib: 64}
backend_loss: {policy: hold, hold: 45s}
backend_probe: {interval: 20s, timeout: 5s, misses: 4}
cdi_annotations: true
renames:
  legacy.example.com/gpu: vendor.com/gpu
compact_ids: [vendor.com/gpu]
backends:
  - resource: vendor.com/nic
    endpoint: /run/nic/plugin.sock
    api: v1beta1
  - {resource: vendor.com/fpga, endpoint: /run/fpga.sock}
)",
                                  "dpproxy.yaml", &c);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.kubelet.kubelet_root, "/var/snap/microk8s/common/var/lib/kubelet");
  EXPECT_EQ(c.kubelet.api, ApiVersion::kV1Alpha);
  EXPECT_EQ(c.kubelet.registration, KubeletRegistration::kPluginWatcher);
  EXPECT_EQ(c.plugin_dir, "/run/dpproxy/plugins");
  EXPECT_EQ(c.status_file, "/run/dpproxy/status.json");
  EXPECT_EQ(c.socket_group, "0");
  EXPECT_EQ(c.kubelet.backend_timeout, absl::Seconds(5));
  EXPECT_EQ(c.dial_timeout, absl::Seconds(2));
  EXPECT_EQ(c.backend_max_list_bytes, 64 << 20);
  EXPECT_EQ(c.policy.loss_policy, LossPolicy::kHold);
  EXPECT_EQ(c.policy.hold, absl::Seconds(45));
  EXPECT_EQ(c.policy.probe.interval, absl::Seconds(20));
  EXPECT_EQ(c.policy.probe.timeout, absl::Seconds(5));
  EXPECT_EQ(c.policy.probe.misses, 4);
  EXPECT_TRUE(c.kubelet.cdi_annotations);
  EXPECT_EQ(c.renames.at("legacy.example.com/gpu"), "vendor.com/gpu");
  EXPECT_EQ(c.compact_ids, std::set<std::string>{"vendor.com/gpu"});
  ASSERT_EQ(c.static_backends.size(), 2u);
  EXPECT_EQ(c.static_backends[0].api, ApiVersion::kV1Beta1);
  EXPECT_EQ(c.static_backends[1].api, std::nullopt);  // auto: probed
}

// `dpproxy --check` prints the configuration in the file's schema; loading
// that text over different defaults gives the same configuration back,
// every setting included.
TEST(ConfigFileTest, TheEffectiveConfigurationRoundTrips) {
  ProxyConfig c = Base();
  ASSERT_TRUE(LoadConfigText(R"(
kubelet: {root: /k, api: v1alpha, registration: plugin-watcher}
plugin_dir: /run/p
status_file: ""
state_dir: /var/lib/x
socket_group: "0"
metrics_address: 0.0.0.0:9464
restore: {policy: unhealthy, hold: 90s}
reconcile: {interval: 0s, grace: 1h}
timeouts: {backend: 1.5s, dial: 2s}
limits: {backend_list_mib: 64}
backend_loss: {policy: hold, hold: 45s}
cdi_annotations: true
renames: {"legacy.example.com/gpu": "vendor.com/gpu", "a.com/x": "b.com/y"}
compact_ids: [vendor.com/gpu]
id_maps: {"b.com/y": {"uuid-1": "x-1", "uuid:2": "x-2"}}
backends:
  - {resource: vendor.com/nic, endpoint: /run/nic/plugin.sock, api: v1beta1}
  - {resource: vendor.com/fpga, endpoint: /run/fpga.sock}
)",
                             "dpproxy.yaml", &c)
                  .ok());
  const std::string yaml = ConfigToYaml(c);
  ProxyConfig other;  // other defaults: every value must come from the text
  other.kubelet.kubelet_root = "/elsewhere";
  other.reconcile_interval = absl::Minutes(7);
  other.policy.hold = absl::Seconds(1);
  absl::Status s = LoadConfigText(yaml, "effective.yaml", &other);
  ASSERT_TRUE(s.ok()) << s << "\n" << yaml;
  EXPECT_EQ(ConfigToYaml(other), yaml);
  EXPECT_EQ(other.kubelet.kubelet_root, "/k");
  EXPECT_EQ(other.reconcile_interval, absl::ZeroDuration());
  EXPECT_EQ(other.kubelet.backend_timeout, absl::Milliseconds(1500));
  EXPECT_EQ(other.id_maps.at("b.com/y").at("uuid:2"), "x-2");
  EXPECT_EQ(other.static_backends[1].api, std::nullopt);
  // The defaults alone round-trip too (over other scalar values; lists and
  // maps in a file add to what flags gave, as they always do).
  ProxyConfig defaults;
  ProxyConfig again;
  again.kubelet.kubelet_root = "/elsewhere";
  again.restore_policy = RestorePolicy::kUnhealthy;
  ASSERT_TRUE(LoadConfigText(ConfigToYaml(defaults), "defaults.yaml", &again).ok());
  EXPECT_EQ(ConfigToYaml(again), ConfigToYaml(defaults));
}

TEST(ConfigFileTest, EmptyFileChangesNothing) {
  ProxyConfig c = Base();
  ASSERT_TRUE(LoadConfigText("", "empty.yaml", &c).ok());
  EXPECT_EQ(c.kubelet.backend_timeout, absl::Seconds(30));
}

struct BadCase {
  const char* text;
  const char* message;
};

TEST(ConfigFileTest, ProblemsNameFileLineKeyAndReason) {
  const BadCase cases[] = {
      {"kubelet:\n  rot: /x\n", "f.yaml:2:3: kubelet.rot: unknown key (known here: api, registration, root)"},
      {"timeouts:\n  backend: forever\n", "f.yaml:2:12: timeouts.backend: \"forever\" is not a duration"},
      {"kubelet: {api: v2}\n", "kubelet.api: \"v2\" is not one of auto, dra, v1alpha, v1beta1"},
      {"backend_loss: {policy: maybe}\n", "backend_loss.policy: \"maybe\" is not one of hold, unhealthy"},
      {"cdi_annotations: sometimes\n", "cdi_annotations: must be true or false"},
      {"backend_probe: {interval: 500ms}\n",
       "backend_probe.interval 500ms is not 0s (off) or at least 1s"},
      {"backend_probe: {timeout: 0s}\n", "backend_probe.timeout 0 is not more than 0s"},
      {"backend_probe: {misses: 0}\n", "backend_probe.misses: must be a whole number from 1 to 100"},
      {"backend_probe: {every: 1s}\n", "backend_probe.every: unknown key"},
      {"id_maps: {vendor.com/gpu: {a: gpu-0}, vendor.com/nic: {b: gpu-0}}\n",
       "id maps of vendor.com/gpu and vendor.com/nic both map a device to \"gpu-0\""},
      {"flap_damping: {flaps: 5, backoff: 2m, max_backoff: 1m}\n",
       "max_backoff at least the backoff"},
      {"compact_ids: vendor.com/gpu\n", "compact_ids: must be a list of resource names"},
      {"compact_ids: [gpu]\n", "compact IDs: "},
      {"limits: {backend_list_mib: 3}\n",
       "limits.backend_list_mib: must be a whole number from 4 to 2047"},
      {"limits: {backend_list_mib: lots}\n", "limits.backend_list_mib: must be a whole number"},
      {"backends: {a: b}\n", "backends: must be a list"},
      {"backends:\n  - {resource: vendor.com/x}\n", "backends[0]: needs an endpoint"},
      {"backends:\n  - {resource: vendor.com/x, endpoint: /s, port: 1}\n", "backends[0].port: unknown key"},
      {"backends:\n  - {resource: vendor.com/x, endpoint: relative.sock}\n",
       "must be an absolute socket path"},
      {"renames: {a.com/x: notvalid}\n", "rename a.com/x -> notvalid"},
      {"kubelet: [1, 2]\n", "kubelet: must be a mapping"},
      {"frobnicate: 1\n", "f.yaml:1:1: frobnicate: unknown key"},
      {"timeouts: {backend: 5s\n", "f.yaml:"},  // malformed YAML
      {"plugin_dir: /var/lib/kubelet/device-plugins\n", "lies inside the kubelet root"},
  };
  for (const BadCase& c : cases) {
    ProxyConfig config = Base();
    absl::Status s = LoadConfigText(c.text, "f.yaml", &config);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.text;
    EXPECT_EQ(config.kubelet.backend_timeout, absl::Seconds(30)) << "changed on error";
  }
}

TEST(ConfigFileTest, ChangedSettingsNamesEachDifferenceByItsPathInTheFile) {
  ProxyConfig a = Base();
  a.static_backends.push_back({"example.com/nic", "/run/nic.sock", std::nullopt});
  EXPECT_TRUE(ChangedSettings(a, a).empty());
  ProxyConfig b = a;
  b.policy.loss_policy = LossPolicy::kHold;
  b.policy.hold = absl::Seconds(30);
  b.kubelet.kubelet_root = "/var/lib/k0s/kubelet";
  b.static_backends.push_back({"example.com/fpga", "/run/fpga.sock", ApiVersion::kV1Alpha});
  b.renames["legacy.example.com/gpu"] = "example.com/gpu";
  std::vector<std::string> lines;
  for (const SettingChange& c : ChangedSettings(a, b)) {
    lines.push_back(absl::StrCat(c.path, ": ", c.from, " -> ", c.to));
  }
  EXPECT_THAT(lines, ::testing::UnorderedElementsAre(
                         "kubelet.root: /var/lib/kubelet -> /var/lib/k0s/kubelet",
                         "backend_loss.policy: unhealthy -> hold",
                         "backend_loss.hold: 0 -> 30s",
                         "renames.legacy.example.com/gpu:  -> example.com/gpu",
                         "backends[1].resource:  -> example.com/fpga",
                         "backends[1].endpoint:  -> /run/fpga.sock",
                         "backends[1].api:  -> v1alpha"));
}

TEST(ConfigFileTest, DraModeIsReadCheckedAndWrittenBack) {
  ProxyConfig c = Base();
  ASSERT_TRUE(LoadConfigText("kubelet: {api: dra}\n"
                             "dra: {driver: gpu.vendor.com, node_name: node-1,\n"
                             "      kubeconfig: /etc/dpproxy/kubeconfig, cdi_dir: /run/cdi}\n",
                             "f.yaml", &c)
                  .ok());
  EXPECT_TRUE(c.dra.enabled);
  EXPECT_FALSE(c.kubelet.api.has_value());
  EXPECT_EQ(c.dra.driver, "gpu.vendor.com");
  EXPECT_EQ(c.dra.node_name, "node-1");
  EXPECT_EQ(c.dra.kubeconfig, "/etc/dpproxy/kubeconfig");
  EXPECT_EQ(c.dra.cdi_dir, "/run/cdi");
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  ProxyConfig again = Base();
  ASSERT_TRUE(LoadConfigText(ConfigToYaml(c), "again.yaml", &again).ok());
  EXPECT_EQ(ConfigToYaml(again), ConfigToYaml(c));
  // What DRA mode cannot run with is named.
  ProxyConfig bad = c;
  bad.dra.driver = "GPU_Vendor";
  EXPECT_THAT(std::string(ValidateConfig(bad).message()), HasSubstr("not a DNS subdomain"));
  bad = c;
  bad.dra.node_name.clear();
  EXPECT_THAT(std::string(ValidateConfig(bad).message()), HasSubstr("no node name"));
  bad = c;
  bad.dra.cdi_dir = "cdi";
  EXPECT_THAT(std::string(ValidateConfig(bad).message()), HasSubstr("not an absolute path"));
}

// Each resource's path toward the kubelet: a device plugin, DRA, or both;
// the ones not named take the default (DRA with kubelet.api: dra).
TEST(ConfigFileTest, PathsPerResourceAreReadCheckedAndWrittenBack) {
  ProxyConfig c = Base();
  ASSERT_TRUE(LoadConfigText("paths: {vendor.com/gpu: both, vendor.com/fpga: dra,\n"
                             "        vendor.com/nic: device-plugin}\n"
                             "dra: {driver: gpu.vendor.com, node_name: node-1}\n",
                             "f.yaml", &c)
                  .ok());
  EXPECT_FALSE(c.dra.enabled);
  EXPECT_EQ(PathOf(c, "vendor.com/gpu"), KubeletPath::kBoth);
  EXPECT_EQ(PathOf(c, "vendor.com/fpga"), KubeletPath::kDra);
  EXPECT_EQ(PathOf(c, "vendor.com/nic"), KubeletPath::kDevicePlugin);
  EXPECT_EQ(PathOf(c, "vendor.com/other"), KubeletPath::kDevicePlugin);
  EXPECT_TRUE(ServesDevicePlugins(c));
  EXPECT_TRUE(ServesDra(c));
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  ProxyConfig again = Base();
  ASSERT_TRUE(LoadConfigText(ConfigToYaml(c), "again.yaml", &again).ok());
  EXPECT_EQ(ConfigToYaml(again), ConfigToYaml(c));
  EXPECT_EQ(again.paths, c.paths);

  // DRA by default: the resources not named go through DRA, and only a
  // resource named otherwise keeps the device-plugin side running.
  ProxyConfig dra = Base();
  ASSERT_TRUE(LoadConfigText("kubelet: {api: dra}\n"
                             "dra: {driver: gpu.vendor.com, node_name: node-1}\n",
                             "f.yaml", &dra)
                  .ok());
  EXPECT_EQ(PathOf(dra, "vendor.com/other"), KubeletPath::kDra);
  EXPECT_FALSE(ServesDevicePlugins(dra));
  dra.paths["vendor.com/nic"] = KubeletPath::kDevicePlugin;
  EXPECT_TRUE(ServesDevicePlugins(dra));
  EXPECT_FALSE(ServesDra(Base()));

  // A resource through DRA with no driver to publish it as, and a path
  // that does not exist, are named.
  ProxyConfig bad = Base();
  bad.paths["vendor.com/gpu"] = KubeletPath::kBoth;
  EXPECT_THAT(std::string(ValidateConfig(bad).message()),
              HasSubstr("paths: vendor.com/gpu is served through DRA (both): that needs a driver "
                        "name"));
  ProxyConfig typo = Base();
  EXPECT_THAT(std::string(LoadConfigText("paths: {vendor.com/gpu: extended}\n", "f.yaml", &typo)
                              .message()),
              HasSubstr("paths.vendor.com/gpu"));
  EXPECT_THAT(std::string(LoadConfigText("paths: [vendor.com/gpu]\n", "f.yaml", &typo).message()),
              HasSubstr("must be a mapping RESOURCE: device-plugin | dra | both"));
}

// A DaemonSet's file names no node: the downward API's NODE_NAME does, as
// for the flags (the Helm chart relies on it).
// The pod-resources view's socket: read, written back, and refused where
// it would take the kubelet's own socket or sit in a directory emptied by
// others.
TEST(ConfigFileTest, ThePodResourcesSocketIsReadAndCheckedAgainstTheKubelets) {
  ProxyConfig c = Base();
  ASSERT_TRUE(LoadConfigText("pod_resources_socket: /var/lib/kubelet/pod-resources/dpproxy.sock\n",
                             "f.yaml", &c)
                  .ok());
  EXPECT_EQ(c.pod_resources_socket, "/var/lib/kubelet/pod-resources/dpproxy.sock");
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  ProxyConfig again = Base();
  ASSERT_TRUE(LoadConfigText(ConfigToYaml(c), "again.yaml", &again).ok());
  EXPECT_EQ(again.pod_resources_socket, c.pod_resources_socket);
  ProxyConfig bad = c;
  bad.pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  EXPECT_THAT(std::string(ValidateConfig(bad).message()),
              ::testing::AllOf(HasSubstr("the kubelet's own pod-resources socket"),
                               HasSubstr("/var/lib/kubelet/pod-resources/dpproxy.sock")));
  bad.pod_resources_socket = "/var/lib/kubelet/device-plugins/view.sock";
  EXPECT_THAT(std::string(ValidateConfig(bad).message()),
              HasSubstr("lies in the kubelet's device-plugins directory"));
  bad.pod_resources_socket = "/var/lib/dpproxy/device-plugins/view.sock";
  EXPECT_THAT(std::string(ValidateConfig(bad).message()), HasSubstr("lies in the plugin directory"));
  bad.pod_resources_socket = "view.sock";
  EXPECT_THAT(std::string(ValidateConfig(bad).message()), HasSubstr("not an absolute path"));
}

TEST(ConfigFileTest, AFileWithoutANodeNameTakesNodeNameFromTheEnvironment) {
  const char* before = ::getenv("NODE_NAME");
  const std::string saved = before != nullptr ? before : "";
  ::unsetenv("NODE_NAME");
  ProxyConfig c = Base();
  const std::string file = "kubelet: {api: dra}\ndra: {driver: gpu.vendor.com}\n";
  EXPECT_THAT(std::string(LoadConfigText(file, "f.yaml", &c).message()),
              HasSubstr("no node name"));
  ::setenv("NODE_NAME", "node-7", 1);
  c = Base();
  absl::Status s = LoadConfigText(file, "f.yaml", &c);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.dra.node_name, "node-7");
  // A name in the file wins.
  c = Base();
  ASSERT_TRUE(LoadConfigText("kubelet: {api: dra}\ndra: {driver: gpu.vendor.com, node_name: n1}\n",
                             "f.yaml", &c)
                  .ok());
  EXPECT_EQ(c.dra.node_name, "n1");
  if (before != nullptr) {
    ::setenv("NODE_NAME", saved.c_str(), 1);
  } else {
    ::unsetenv("NODE_NAME");
  }
}

// --takeover needs a state directory to hand over, and registration
// through kubelet.sock; DRA mode has none.
TEST(ConfigFileTest, TakeoverIsRefusedWhereItCannotWorkOnly) {
  ProxyConfig c = Base();
  c.state_dir = "/var/lib/dpproxy";
  c.takeover = true;
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  ProxyConfig no_state = c;
  no_state.state_dir.clear();
  EXPECT_THAT(std::string(ValidateConfig(no_state).message()), HasSubstr("needs --state_dir"));
  ProxyConfig watcher = c;
  watcher.kubelet.registration = KubeletRegistration::kPluginWatcher;
  EXPECT_THAT(std::string(ValidateConfig(watcher).message()),
              HasSubstr("needs registration through kubelet.sock"));
  // A DRA driver takes over through the plugin watcher, whatever the
  // device-plugin registration setting says.
  ProxyConfig dra = watcher;
  dra.dra.enabled = true;
  dra.dra.driver = "gpu.vendor.com";
  dra.dra.node_name = "node-1";
  EXPECT_TRUE(ValidateConfig(dra).ok()) << ValidateConfig(dra);
}

TEST(ConfigFileTest, MissingFileIsAClearError) {
  ProxyConfig c = Base();
  absl::Status s = LoadConfigFile("/nonexistent/dpproxy.yaml", &c);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("cannot read configuration file: open /nonexistent/dpproxy.yaml"));
}

TEST(ConfigFileTest, LoadsFromDisk) {
  testing::ShortTempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("c.yaml"), "timeouts: {backend: 1m}\n").ok());
  ProxyConfig c = Base();
  ASSERT_TRUE(LoadConfigFile(dir.Sub("c.yaml"), &c).ok());
  EXPECT_EQ(c.kubelet.backend_timeout, absl::Minutes(1));
}

// A configuration file is a few kilobytes: a huge one (a mistake, or a
// file being written) is refused before it is read whole or parsed, at
// start and on reload alike (both load it through LoadConfigFile).
TEST(ConfigFileTest, AFileOverTheLimitIsRefusedNamingItsSize) {
  testing::ShortTempDir dir;
  std::string big = "timeouts: {backend: 1m}\n";
  big.append(kMaxConfigFileBytes, '#');
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("big.yaml"), big).ok());
  ProxyConfig c = Base();
  const ProxyConfig before = c;
  absl::Status s = LoadConfigFile(dir.Sub("big.yaml"), &c);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(absl::StrCat("is ", big.size(), " bytes, more than the limit of ",
                                     kMaxConfigFileBytes, " bytes")));
  EXPECT_EQ(c.kubelet.backend_timeout, before.kubelet.backend_timeout);  // untouched
  // Exactly at the limit is still read.
  std::string edge = "timeouts: {backend: 2m}\n";
  edge.resize(kMaxConfigFileBytes, '\n');
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("edge.yaml"), edge).ok());
  ASSERT_TRUE(LoadConfigFile(dir.Sub("edge.yaml"), &c).ok());
  EXPECT_EQ(c.kubelet.backend_timeout, absl::Minutes(2));
}

TEST(ConfigFileTest, AConfigurationThatIsNotAFileIsRefused) {
  testing::ShortTempDir dir;
  ASSERT_EQ(::mkfifo(dir.Sub("fifo").c_str(), 0600), 0);  // would block a plain read
  ProxyConfig c = Base();
  absl::Status s = LoadConfigFile(dir.Sub("fifo"), &c);
  EXPECT_THAT(std::string(s.message()), HasSubstr("is not a regular file"));
  EXPECT_THAT(std::string(LoadConfigFile(dir.path(), &c).message()),
              HasSubstr("is not a regular file"));
}

// A plugin directory that is the kubelet's device-plugins directory under
// another path (a bind mount) is refused: dpproxy removes stale sockets in
// its plugin directory and must never do so among the kubelet's. A real
// bind mount (the tests run as root, as CI does).
TEST(ConfigValidationTest, ABindMountOfTheKubeletsDirectoryIsRefused) {
  testing::ShortTempDir dir;
  ASSERT_TRUE(MakeDirs(dir.Sub("k/device-plugins")).ok());
  ASSERT_TRUE(MakeDirs(dir.Sub("p")).ok());
  ASSERT_EQ(::mount(dir.Sub("k/device-plugins").c_str(), dir.Sub("p").c_str(), nullptr, MS_BIND,
                    nullptr),
            0)
      << "bind mount: " << std::strerror(errno) << " (these tests run as root)";
  ProxyConfig c = Base();
  c.kubelet.kubelet_root = dir.Sub("k");
  c.plugin_dir = dir.Sub("p");
  absl::Status s = ValidateConfig(c);
  ::umount2(dir.Sub("p").c_str(), MNT_DETACH);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("a bind mount of it?"));
  // Unmounted, the same directory is dpproxy's own again.
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c).message();
}

// The same for the state directory: a journal in the kubelet's
// device-plugins/ (or plugins_registry/) under another path would be wiped
// by the kubelet's next start.
TEST(ConfigValidationTest, AStateDirectoryBindMountedOnTheKubeletsDirectoryIsRefused) {
  for (const char* sub : {"device-plugins", "plugins_registry"}) {
    SCOPED_TRACE(sub);
    testing::ShortTempDir dir;
    ASSERT_TRUE(MakeDirs(dir.Sub(absl::StrCat("k/", sub))).ok());
    ASSERT_TRUE(MakeDirs(dir.Sub("s")).ok());
    ASSERT_EQ(::mount(dir.Sub(absl::StrCat("k/", sub)).c_str(), dir.Sub("s").c_str(), nullptr,
                      MS_BIND, nullptr),
              0)
        << "bind mount: " << std::strerror(errno) << " (these tests run as root)";
    ProxyConfig c = Base();
    c.kubelet.kubelet_root = dir.Sub("k");
    c.state_dir = dir.Sub("s");
    absl::Status s = ValidateConfig(c);
    ::umount2(dir.Sub("s").c_str(), MNT_DETACH);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("state directory"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("a bind mount of it?"));
    EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c).message();
  }
}

TEST(ApiVersionTest, OneSpellingForPeopleOneForTheWire) {
  for (ApiVersion api : {ApiVersion::kV1Alpha, ApiVersion::kV1Beta1}) {
    EXPECT_EQ(*ParseApiVersion(ApiName(api), false), api);
    EXPECT_EQ(*ParseApiVersion(ApiWireVersion(api), false), api);
  }
  EXPECT_EQ(ApiName(ApiVersion::kV1Alpha), "v1alpha");
  EXPECT_EQ(ApiWireVersion(ApiVersion::kV1Alpha), "v1alpha2");
  EXPECT_EQ(ApiWireVersion(ApiVersion::kV1Beta1), "v1beta1");
  EXPECT_EQ(*ParseApiVersion("auto", /*allow_auto=*/true), std::nullopt);
  EXPECT_EQ(ParseApiVersion("auto", /*allow_auto=*/false).status().message(),
            "auto is not v1alpha or v1beta1");
  EXPECT_EQ(ParseApiVersion("v1", /*allow_auto=*/true).status().message(),
            "v1 is not auto, v1alpha or v1beta1");
}

}  // namespace
}  // namespace dpproxy
