// The simulated kubelet releases and personalities (kubelet_sim.h).
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tools/kubelet_sim/kubelet_sim.h"

namespace dpproxy::sim {

absl::StatusOr<Personality> ParsePersonality(absl::string_view name) {
  if (name == "v1alpha") return Personality::kV1Alpha;
  if (name == "v1beta1-async") return Personality::kV1Beta1Async;
  if (name == "v1beta1-sync") return Personality::kV1Beta1Sync;
  if (name == "plugin-watcher") return Personality::kPluginWatcher;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown personality \"", name,
      "\"; expected one of v1alpha, v1beta1-async, v1beta1-sync, plugin-watcher"));
}

std::string PersonalityName(Personality p) {
  switch (p) {
    case Personality::kV1Alpha: return "v1alpha";
    case Personality::kV1Beta1Async: return "v1beta1-async";
    case Personality::kV1Beta1Sync: return "v1beta1-sync";
    case Personality::kPluginWatcher: return "plugin-watcher";
  }
  return "unknown";
}

const std::vector<KubeletGeneration>& KubeletGenerations() {
  static const auto* const kGenerations = new std::vector<KubeletGeneration>{
      {9, 9,
       "v1alpha: deviceplugin.Registration, version \"v1alpha2\" exactly; Register returns "
       "before the plugin is dialled; a lost plugin's resource is removed at once; container "
       "annotations are not read"},
      {10, 15,
       "v1beta1: asynchronous Register, options taken from the RegisterRequest; device topology, "
       "GetPreferredAllocation and cdi_devices unknown (dropped); plugin watcher "
       "(plugins_registry/) from 1.13"},
      {16, 18, "as 1.10-1.15, and device topology (NUMA nodes) is read"},
      {19, 24, "as 1.16-1.18, and GetPreferredAllocation is called when the plugin offers it"},
      {25, 27,
       "synchronous Register: the kubelet dials the plugin (10 s) and calls "
       "GetDevicePluginOptions before answering; RegisterRequest.options ignored"},
      {28, 30,
       "as 1.25-1.27, and cdi_devices read only with the DevicePluginCDIDevices feature gate "
       "(alpha in 1.28: off by default; beta in 1.29-1.30: on by default)"},
      {31, 36, "as 1.28-1.30 with the CDI gate GA: cdi_devices always read"},
      {37, kNewestKubeletMinor,
       "as 1.31-1.36, with a resource's clients kept per socket: a stream's end disconnects "
       "only its own socket, and a registration at a socket already connected is refused "
       "(\"device plugin already connected\")"},
  };
  return *kGenerations;
}

std::string GenerationName(const KubeletGeneration& g) {
  if (g.first_minor == g.last_minor) return absl::StrCat("1.", g.first_minor);
  return absl::StrCat("1.", g.first_minor, "-1.", g.last_minor);
}

std::string KubeletVersion::GenerationName() const {
  for (const KubeletGeneration& g : KubeletGenerations()) {
    if (minor >= g.first_minor && minor <= g.last_minor) return sim::GenerationName(g);
  }
  return absl::StrCat("1.", minor);
}

KubeletVersion KubeletVersionOf(Personality p) {
  KubeletVersion k;
  k.name = PersonalityName(p);
  k.personality = p;
  switch (p) {
    case Personality::kV1Alpha: k.minor = 9; break;
    case Personality::kV1Beta1Async: k.minor = 24; break;
    case Personality::kV1Beta1Sync: k.minor = 31; break;
    case Personality::kPluginWatcher:
      k.minor = 31;
      k.plugin_watcher = true;
      break;
  }
  return k;
}

absl::StatusOr<KubeletVersion> ParseKubeletVersion(absl::string_view name,
                                                   std::optional<bool> cdi_gate) {
  KubeletVersion k;
  if (absl::StatusOr<Personality> p = ParsePersonality(name); p.ok()) {
    k = KubeletVersionOf(*p);
  } else {
    absl::string_view rest = name;
    int minor = 0;
    if (!absl::ConsumePrefix(&rest, "1.") || !absl::SimpleAtoi(rest, &minor) || rest.empty() ||
        !absl::ascii_isdigit(static_cast<unsigned char>(rest[0]))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown kubelet \"", name, "\"; expected a release 1.", kOldestKubeletMinor, " to 1.",
          kNewestKubeletMinor, " (e.g. 1.24) or v1alpha, v1beta1-async, v1beta1-sync, "
          "plugin-watcher"));
    }
    if (minor < kOldestKubeletMinor || minor > kNewestKubeletMinor) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kubelet ", name, " is not simulated: the device-plugin API of 1.", kOldestKubeletMinor,
          " to 1.", kNewestKubeletMinor, " is (1.8's v1alpha1 is not)"));
    }
    k.name = std::string(name);
    k.minor = minor;
    k.personality = minor <= 9    ? Personality::kV1Alpha
                    : minor <= 24 ? Personality::kV1Beta1Async
                                  : Personality::kV1Beta1Sync;
    k.plugin_watcher = minor >= 13;
    k.cdi_gate = minor >= 29;
  }
  if (cdi_gate.has_value()) {
    if (k.minor < 28 || k.minor >= 31) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kubelet ", name, " has no DevicePluginCDIDevices feature gate to set (1.28-1.30 do; ",
          k.minor < 28 ? "older releases never read cdi_devices" : "1.31+ always read them",
          ")"));
    }
    k.cdi_gate = *cdi_gate;
  }
  return k;
}

}  // namespace dpproxy::sim
