// File: config_file.h
//
// dpproxy's YAML configuration file, for many backends, renames, policies
// and deadlines. Every key is optional; what is absent keeps the value it
// had. Unknown keys, wrong types and bad values are refused with the file,
// line, key and reason, e.g.
//   /etc/dpproxy.yaml:7:3: timeouts.backend: "forever" is not a duration
//
//   kubelet:
//     root: /var/lib/kubelet
//     api: auto                   # auto | v1beta1 | v1alpha
//     registration: kubelet       # kubelet | plugin-watcher
//   plugin_dir: /var/lib/dpproxy/device-plugins
//   status_file: /var/lib/dpproxy/status.json
//   state_dir: /var/lib/dpproxy
//   restore: {policy: trust, hold: 5m}             # trust | unhealthy
//   reconcile: {interval: 1m, grace: 5m}
//   timeouts: {backend: 30s, dial: 10s}
//   backend_loss: {policy: unhealthy, hold: 30s}   # unhealthy | hold
//   cdi_annotations: false
//   renames: {legacy.example.com/gpu: vendor.com/gpu}
//   compact_ids: [vendor.com/gpu]                  # short IDs toward the kubelet
//   id_maps:                                        # backend ID -> kubelet ID
//     vendor.com/gpu: {GPU-1a2b...: "0", GPU-3c4d...: "1"}
//   backends:
//     - {resource: vendor.com/nic, endpoint: /run/nic/plugin.sock, api: auto}
#ifndef DPPROXY_PROXY_CONFIG_CONFIG_FILE_H_
#define DPPROXY_PROXY_CONFIG_CONFIG_FILE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proxy/config/proxy_config.h"

namespace dpproxy {

// Applies the file at `path` on top of `config`. kInvalidArgument with
// "<path>:<line>:<column>: <key>: <reason>" on any problem; `config` is
// then unchanged.
// A configuration file larger than this is refused (at start and on
// reload) before it is parsed: a real one is a few kilobytes.
inline constexpr size_t kMaxConfigFileBytes = 1 << 20;

absl::Status LoadConfigFile(const std::string& path, ProxyConfig* config);

// Same, from text (`name` stands for the file in messages).
absl::Status LoadConfigText(const std::string& text, const std::string& name,
                            ProxyConfig* config);

// `config` in the file's own schema: every setting the file can hold, with
// the value in effect (defaults included). Loading the text over the
// defaults gives the same configuration back (its lists and maps add to
// those already set, as any file's do). For `dpproxy --check`.
std::string ConfigToYaml(const ProxyConfig& config);

// One setting that differs between two configurations, named by its path
// in the file's schema ("backend_loss.hold", "backends[1].endpoint",
// "renames.legacy.example.com/gpu"); "" for a value one side lacks.
struct SettingChange {
  std::string path;
  std::string from;
  std::string to;
};
// Every setting that differs, in the schema's order. For a reload.
std::vector<SettingChange> ChangedSettings(const ProxyConfig& from, const ProxyConfig& to);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CONFIG_CONFIG_FILE_H_
