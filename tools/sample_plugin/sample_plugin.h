// File: sample_plugin.h
//
// A configurable device plugin speaking v1alpha (Kubernetes 1.9) or v1beta1,
// for testing kubelets, dpproxy and CI pipelines. It serves its socket
// before registering, registers at the kubelet socket (or through the plugin
// watcher), re-registers when the kubelet restarts (inotify on the socket
// directory, plus a stat check once a second), and answers every call with
// responses derived from the device IDs:
//
//   envs        SAMPLE_<NAME>_DEVICES=<ids comma-separated>, SAMPLE_PLUGIN_API
//   mounts      /var/run/sample-plugin/<name>/<id> -> /run/sample/<id> (ro)
//   devices     /dev/sample/<id> -> /dev/sample/<id> (rw)
//   annotations <domain>/devices=<ids>                      (v1beta1 only)
//   cdi_devices <domain>/<name>=<id>                        (v1beta1 only)
//
// where the resource is <domain>/<name>. With --preferred, it prefers
// must-include devices, then devices packed on as few NUMA nodes as
// possible, higher IDs first (so its choice is visibly not the kubelet's
// default of the first IDs).
#ifndef DPPROXY_TOOLS_SAMPLE_PLUGIN_SAMPLE_PLUGIN_H_
#define DPPROXY_TOOLS_SAMPLE_PLUGIN_SAMPLE_PLUGIN_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/config/api_version.h"
#include "proxy/util/dir_watcher.h"
#include "proxy/events/event_log.h"
#include "proxy/util/files.h"
#include "proxy/util/waitable_count.h"
#include "tools/sample_plugin/control.pb.h"

namespace dpproxy::sample {

enum class RegistrationMode { kKubelet, kPluginWatcher, kNone };

// Which signal makes the plugin register again (RegistrationMode::kKubelet).
// Plugins in the field watch one or the other; the kubelet's contract is
// that a kubelet start forgets every plugin, and a plugin may notice it
// through either.
enum class RestartSignal {
  // Both: its own socket removed (served again, then registered), or
  // kubelet.sock created anew.
  kEither,
  // Only its own socket, looked at on every change of its directory and
  // once a second: once registered, a new kubelet.sock alone goes unseen
  // (a generic plugin in the field polls its socket's existence).
  kOwnSocket,
  // Only kubelet.sock: a new one restarts the plugin's server (its socket
  // served anew, its streams ended) and registers; its socket removed
  // alone goes unseen.
  kKubeletSocket,
};

struct SamplePluginOptions {
  ApiVersion api = ApiVersion::kV1Beta1;
  std::string resource = "example.com/device";
  int devices = 4;
  // "{i}" is replaced by the index, "{uuid}" by a UUID derived from the
  // resource and index (stable across runs), "{ctrl}" by the index as one
  // control character (at most 32 devices; a generic plugin in the field
  // names its devices so).
  std::string id_pattern = "dev-{i}";
  // 0: no topology. N > 0: device i is on NUMA node i % N (v1beta1 only).
  int numa_nodes = 0;
  bool preferred = false;            // offer GetPreferredAllocation
  bool pre_start_required = false;   // ask for PreStartContainer
  // Registration socket of the kubelet (or of dpproxy). The plugin's own
  // socket is created in the same directory.
  std::string kubelet_socket = "/var/lib/kubelet/device-plugins/kubelet.sock";
  // Own socket file name; empty: sample-<name>.sock.
  std::string socket_name;
  RegistrationMode registration = RegistrationMode::kKubelet;
  // plugin-watcher mode: directory for the registration socket.
  std::string plugins_registry_dir = "/var/lib/kubelet/plugins_registry";
  // Version string to send in Register; empty: the API's own ("v1alpha2"
  // or "v1beta1"). For testing how a kubelet rejects a wrong version.
  std::string register_version;
  // Toggle this device's health every flip_interval (0: never).
  std::string flip_device;
  absl::Duration flip_interval = absl::ZeroDuration();
  // Stop after this many flips (0: flip until stopped).
  int flip_count = 0;
  // Hand each device-list update to only one ListAndWatch stream, as the
  // kubelet's own stub plugin does.
  bool single_stream_updates = false;
  // Fault injection: delay Allocate by this much; fail it with this message.
  absl::Duration allocate_delay = absl::ZeroDuration();
  std::string fail_allocate;
  // Learn the devices in ListAndWatch, as some generic plugins do: until
  // this process has sent its first list, Allocate answers "requested
  // device does not exist" (a kubelet never calls Allocate on a connection
  // before its first list). `first_list_delay` holds that first list back.
  bool devices_from_list_and_watch = false;
  // Pad every container's Allocate answer with an environment variable
  // SAMPLE_PADDING of this many bytes (an answer a kubelet cannot receive
  // once it is over 4 MiB). 0: none.
  size_t allocate_padding = 0;
  absl::Duration first_list_delay = absl::ZeroDuration();
  // Give the options in RegisterRequest only, as plugins written for
  // kubelets up to 1.24 may: GetDevicePluginOptions then fails the way a Go
  // plugin answering nil does (a kubelet from 1.25 refuses such a plugin).
  bool options_only_in_register = false;
  // Register without options, and die on GetDevicePluginOptions, as a Go
  // plugin written for kubelets up to 1.24 does when its handler answers
  // nil (its generated server panics): the process exits with status 2
  // when `exit_on_panic` (the binary), else the plugin stops serving at
  // once, its socket removed (in a test's process).
  bool panic_on_options = false;
  bool exit_on_panic = false;
  // What makes it register again; see RestartSignal.
  RestartSignal restart_signal = RestartSignal::kEither;
  // Called on the registering thread before each registration attempt,
  // before the socket is looked at (a test restarts the kubelet there).
  // Null: none; the binary never sets it.
  std::function<void()> before_register_attempt;
  // Fault injection: send malformed device lists (see kDeviceListFaults):
  // "duplicate-id" repeats the first device, "empty-id" adds a device with
  // an empty ID, "newline-id" adds "bad\nid", "unknown-health" reports the
  // first device as "Sick". Empty: well-formed lists.
  std::string device_list_fault;
  // Fault injection for conformance tests: one behaviour of a buggy plugin,
  // named in kPluginFaults (see there); empty: none.
  std::string fault;
  // Where to write the CDI spec behind the cdi_devices it answers (v1beta1),
  // as vendor plugins with CDI do: <cdi_dir>/sample-plugin-<domain>-<name>.json,
  // kind <domain>/<name>, one device per ID with the node
  // /dev/sample-cdi/<id>. Written at Start, left in place at Stop. Empty:
  // none (a runtime cannot resolve those names).
  std::string cdi_dir;
  // A device node every container gets, whatever it was allocated, as GPU
  // plugins give every container their control node (an nvidiactl-like
  // node): this host path, also as the container path. Empty: none.
  std::string control_node;
};

// The values SamplePluginOptions::fault accepts, each a bug seen in real
// device plugins, with the dpconform scenario it fails:
//   wrong-version          registers with version "v1" (or "v1alpha1")    registers
//   register-before-serve  registers once, then serves                    serves-first (1.25+)
//   no-devices             sends an empty device list                     device-list
//   stream-per-update      ends its ListAndWatch stream at a change, as
//                          if the kubelet would open a new one            health
//   no-container-response  answers Allocate with no container response   allocate
//   same-device-node       names the first device's node for every one   allocate-two
//   cdi-only               gives device access through cdi_devices only  allocate (before CDI)
//   preferred-wrong-size   prefers every available device                 preferred (1.19+)
//   prestart-fails         fails PreStartContainer                        prestart
//   no-reregister          registers once per process                     kubelet-restart
//   late-wipe-blind        serves again only when kubelet.sock changes    kubelet-crash
//   unstable-ids           device IDs change with every process           plugin-restart
//   huge-list              sends more than 4 MiB of device list           list-size
//   watcher-wrong-type     plugin-watcher GetInfo says "CSIPlugin"        plugin-watcher
//   shared-socket          serves every resource on socket "sample.sock"  multi-resource
//   stale-socket-blocks    will not start where its socket file is left,  allocate-restart
//                          as Go's net.Listen on a unix socket
inline constexpr const char* kPluginFaults[] = {
    "wrong-version",        "register-before-serve", "no-devices",      "stream-per-update",
    "no-container-response", "same-device-node",     "cdi-only",        "preferred-wrong-size",
    "prestart-fails",       "no-reregister",         "late-wipe-blind", "unstable-ids",
    "huge-list",            "watcher-wrong-type",    "shared-socket",  "slow-reserve",
    "stale-socket-blocks"};

// The most devices set-devices may ask for (--devices takes up to 100,000).
inline constexpr int kMaxDevicesAtRuntime = 1000000;

// The values SamplePluginOptions::device_list_fault accepts.
inline constexpr const char* kDeviceListFaults[] = {"duplicate-id", "empty-id", "newline-id",
                                                    "unknown-health"};

// Checks the options; kInvalidArgument naming the flag and the problem.
absl::Status ValidateOptions(const SamplePluginOptions& options);

// The device IDs the options describe, in index order.
std::vector<std::string> DeviceIds(const SamplePluginOptions& options);

class SamplePlugin {
 public:
  explicit SamplePlugin(SamplePluginOptions options);
  ~SamplePlugin();

  SamplePlugin(const SamplePlugin&) = delete;
  SamplePlugin& operator=(const SamplePlugin&) = delete;

  // Serves the socket, then registers (a failed registration is an event
  // and a status, not an error: the plugin keeps serving and tries again
  // when the kubelet socket is recreated), then watches for kubelet
  // restarts. Errors: bad options, cannot listen.
  absl::Status Start();
  // Stops serving and removes the plugin's sockets. Idempotent.
  void Stop();

  // Changes one device's health and sends the new list. kNotFound for an
  // unknown ID, kInvalidArgument for a health other than Healthy/Unhealthy.
  absl::Status SetHealth(const std::string& id, const std::string& health);
  // Lists `count` devices from now on (the IDs of --devices=count), as
  // hardware plugged in or taken out, on every open stream.
  absl::Status SetDeviceCount(int count);

  absl::Status StartControl(const std::string& socket_path);
  void StopControl();

  PluginStatus Status();
  EventLog& events() { return events_; }
  std::string socket_path() const { return socket_path_; }
  // Last registration attempt's result (OK before any attempt).
  absl::Status last_registration();
  // The kubelet.sock the plugin counts itself registered at (as the file
  // was when its Register connected); none before the first registration
  // and after a kubelet start removed the plugin's socket.
  std::optional<FileId> registered_kubelet();
  // Looks at the kubelet (and registers where due) made so far: once a
  // second, and at each change of the socket's directory.
  const WaitableCount& kubelet_checks() const { return kubelet_checks_; }

  // Implementation, public for the .cc file's services.
  class Impl;
  struct Services;

 private:
  void ServeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(server_mu_);
  // Registers when a new kubelet is there (registrar thread, and Start()),
  // and counts the look (kubelet_checks_).
  void CheckKubelet();
  void CheckKubeletOnce();
  // The directory watcher's callback: serves again, wakes the registrar.
  void OnDirEvent();
  void RegistrarLoop();
  // Serves the socket again if a kubelet start removed it; true if it did.
  bool ServeAgainIfRemoved();
  // Ends the streams and serves the socket anew.
  void ServeAnewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(server_mu_);
  // ServeAnewLocked, unless the plugin died (RestartSignal::kKubeletSocket).
  void RestartServer();
  // The panic of panic_on_options: stops serving, from a thread of its own.
  void Die();
  // One Register at options_.kubelet_socket. `reached`: that file as it
  // was once the connection to it was made (unset if none was).
  absl::Status RegisterOnce(std::optional<FileId>* reached);
  absl::Status WriteCdiSpec();
  void FlipLoop();

  const SamplePluginOptions options_;
  const std::string socket_path_;
  EventLog events_{"sample_plugin"};
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<Services> services_;

  absl::Mutex server_mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(server_mu_);
  std::unique_ptr<grpc::Server> control_server_;
  std::unique_ptr<DirWatcher> watcher_;
  std::thread flipper_;
  // Registers off the watcher's thread, so a Register blocked on a
  // kubelet's dial never keeps the socket from being served again.
  std::thread registrar_;
  absl::Mutex wake_mu_;
  bool wake_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool stop_registrar_ ABSL_GUARDED_BY(wake_mu_) = false;

  absl::Mutex check_mu_;  // one registration at a time
  WaitableCount kubelet_checks_;
  // How many times the socket was served again (a kubelet start removed
  // it), and how many of those a registration has answered: one made once
  // the socket was served again answers it; a serve during a Register asks
  // for another.
  std::atomic<uint64_t> served_again_{0};
  uint64_t answered_serves_ ABSL_GUARDED_BY(check_mu_) = 0;
  std::optional<FileId> registered_kubelet_ ABSL_GUARDED_BY(check_mu_);
  std::optional<FileId> failed_kubelet_ ABSL_GUARDED_BY(check_mu_);
  absl::Status last_registration_ ABSL_GUARDED_BY(check_mu_);
  std::atomic<bool> started_{false};
  std::atomic<bool> dead_{false};  // panic_on_options fired
  std::thread death_;
  // late-wipe-blind: the kubelet socket as last seen by ServeAgainIfRemoved.
  std::optional<FileId> blind_kubelet_ ABSL_GUARDED_BY(server_mu_);
  // slow-reserve: when the socket was first seen gone.
  std::optional<absl::Time> gone_since_ ABSL_GUARDED_BY(server_mu_);
  bool Faulty(const char* fault) const { return options_.fault == fault; }
};

}  // namespace dpproxy::sample

#endif  // DPPROXY_TOOLS_SAMPLE_PLUGIN_SAMPLE_PLUGIN_H_
