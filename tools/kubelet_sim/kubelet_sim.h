// File: kubelet_sim.h
//
// A kubelet stand-in for testing device plugins and dpproxy: it serves the
// device-plugin Registration service at <root>/device-plugins/kubelet.sock
// in one of four personalities, connects to registered plugins, follows
// their device lists, admits pods (Allocate, GetPreferredAllocation,
// PreStartContainer), checkpoints allocations the way the kubelet does, and
// serves the pod-resources API. Its behaviour follows the real kubelet's device manager
// (kubernetes/kubernetes pkg/kubelet/cm/devicemanager):
//
//   v1alpha        Kubernetes 1.9: /deviceplugin.Registration, exact
//                  version "v1alpha2", asynchronous, no grace period.
//   v1beta1-async  1.10-1.24: /v1beta1.Registration, options read from the
//                  RegisterRequest, plugin dialled after Register returns.
//   v1beta1-sync   1.25+: Register dials the plugin (10 s) and calls
//                  GetDevicePluginOptions before returning; request options
//                  are ignored.
//   plugin-watcher v1beta1-sync plus the plugin watcher on
//                  <root>/plugins_registry/ and the DEPRECATION marker.
//
// Every action is recorded as a JSON-lines event (events()).
#ifndef DPPROXY_TOOLS_KUBELET_SIM_KUBELET_SIM_H_
#define DPPROXY_TOOLS_KUBELET_SIM_KUBELET_SIM_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/server.h>
#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/events/event_log.h"
#include "proto/pluginregistration/api.pb.h"
#include "tools/kubelet_sim/control.pb.h"
#include "tools/kubelet_sim/device_manager.h"
#include "tools/kubelet_sim/dra_manager.h"
#include "tools/kubelet_sim/plugin_manager.h"

namespace dpproxy::sim {

enum class Personality { kV1Alpha, kV1Beta1Async, kV1Beta1Sync, kPluginWatcher };

absl::StatusOr<Personality> ParsePersonality(absl::string_view name);
std::string PersonalityName(Personality p);

// A kubelet release as the simulator plays it: how it registers plugins
// (the personality) and what of the device-plugin API it reads, by minor
// version (the v1beta1 API's fields by release, and the device manager). What a release does not
// read it drops on receipt, silently, as the release's own proto would
// (an unknown field is skipped), so a plugin relying on it sees the failure
// that release's users would see.
struct KubeletVersion {
  std::string name;  // as asked for: "1.24", or a personality ("v1beta1-sync")
  Personality personality = Personality::kV1Beta1Sync;
  int minor = 31;
  bool plugin_watcher = false;  // watches <root>/plugins_registry/ (1.13+)
  // The DevicePluginCDIDevices feature gate: alpha in 1.28 (off unless
  // set), beta in 1.29-1.30 (on unless unset), GA and locked on from 1.31.
  bool cdi_gate = true;

  bool ReadsTopology() const { return minor >= 16; }
  bool CallsGetPreferredAllocation() const { return minor >= 19; }
  bool ReadsCdiDevices() const { return minor >= 31 || (minor >= 28 && cdi_gate); }
  // Clients tracked per socket (kubernetes#135437, merged for a release
  // our facts do not name yet): when a replaced client's stream ends, only
  // a client at that same socket is disconnected. Off unless asked for
  // (--per_socket_clients); meaningful from 1.25.
  bool per_socket_clients = false;

  // 1.25-1.36 keep a replaced client running and, when its stream ends,
  // disconnect whatever client holds the resource name: a rolling update's
  // new registration is torn down when the old instance exits
  // (kubernetes#121994). With per_socket_clients, only when the new
  // instance uses the old one's socket name.
  bool TearsDownByName() const { return minor >= 25 && minor <= 36; }
  // 1.37+ keep every client of a resource, one per socket, in the
  // registration handler and in the device manager (endpointStore): a new
  // registration joins the others and becomes the resource's endpoint; a
  // stream's end disconnects only its own socket, and the last one marks
  // the resource unhealthy, else a remaining endpoint takes over. A
  // registration at a socket already connected is refused ("device plugin
  // already connected"), and the refusal deletes every entry of that
  // socket from the handler's list, the connected one included, so that
  // its end later disconnects nothing and the device manager keeps it
  // (pkg/kubelet/cm/devicemanager: plugin/v1beta1/handler.go, manager.go
  // PluginConnected/PluginDisconnected, 1.37.2).
  bool TracksClientsPerSocket() const { return minor >= 37; }
  // At start the device manager removes only the sockets of device-plugins/
  // (os.Stat: through links), where older releases remove every entry that
  // is not a directory (os.Lstat). 1.31.0 did it too, and 1.31.1 went back;
  // a minor plays its latest patch (CleanupPluginDirectory in
  // pkg/kubelet/cm/devicemanager/manager.go: 1.31.0, 1.31.14, 1.32.13,
  // 1.33.0).
  bool WipesOnlySockets() const { return minor >= 33; }
  // The kubelet's generation, e.g. "1.19-1.24" for 1.21.
  std::string GenerationName() const;
};

// The largest message on the control socket (both ways): the state of a
// node with hundreds of thousands of devices.
inline constexpr int kControlMaxMessageBytes = 256 << 20;

// The oldest and newest kubelet minor releases the simulator knows.
inline constexpr int kOldestKubeletMinor = 9;
inline constexpr int kNewestKubeletMinor = 37;

// "1.N" (9 <= N <= 37) or a personality name (an alias: v1alpha is 1.9,
// v1beta1-async 1.24, v1beta1-sync 1.31, plugin-watcher 1.31 with the
// plugin watcher). `cdi_gate` overrides the feature gate's default where
// the release has the gate (1.28-1.30). Errors name what is accepted.
absl::StatusOr<KubeletVersion> ParseKubeletVersion(absl::string_view name,
                                                   std::optional<bool> cdi_gate = std::nullopt);
KubeletVersion KubeletVersionOf(Personality p);

// The generations, oldest first, each with its first and last minor and
// what sets it apart (for --list and the docs).
struct KubeletGeneration {
  int first_minor;
  int last_minor;
  const char* differences;
};
const std::vector<KubeletGeneration>& KubeletGenerations();
// "1.9", or "1.19-1.24".
std::string GenerationName(const KubeletGeneration& g);

struct KubeletSimOptions {
  // Holds device-plugins/, plugins_registry/, pod-resources/.
  std::string root_dir = "/var/lib/kubelet";
  Personality personality = Personality::kV1Beta1Sync;
  // The release to play; when set it wins over `personality`.
  std::optional<KubeletVersion> kubelet;
  // How long a lost plugin's resource is kept (devices unhealthy) before it
  // is removed. Default: none for v1alpha (1.9 dropped it at once), 5 minutes
  // for the v1beta1 personalities.
  std::optional<absl::Duration> endpoint_grace;
  // The kubelet's limit for dialling a plugin.
  absl::Duration dial_timeout = absl::Seconds(10);
  // Serve <root>/pod-resources/kubelet.sock.
  bool pod_resources = true;
  // Wipe device-plugins/ once more this long after kubelet.sock listens, or
  // when the first Register arrives if that is sooner (the worst case of
  // the race): a stress beyond a real kubelet, which cleans up before it
  // listens; a plugin that registers at once then has its socket removed
  // under the kubelet's dial. 0: wipe only before listening.
  absl::Duration late_wipe = absl::ZeroDuration();
  // DRA (1.32+). The CDI directories the container runtime reads: a
  // prepared claim's CDI names are resolved there as a runtime would (see
  // PrepareClaims); empty: not resolved.
  std::vector<std::string> cdi_dirs;
  // The API server the node's kubelet talks to (a kubeconfig) and the
  // node's name: at each start the kubelet deletes the node's
  // ResourceSlices (the kubelet deletes them when it starts; KEP-4381). Empty: no API server.
  std::string kubeconfig;
  std::string node_name = "node-1";
  // When a started kubelet re-admits the pods it found (about 1 s on a
  // real 1.36.2 node).
  absl::Duration readmit_delay = absl::Seconds(1);
  // How long <root>/pods/<UID> outlives a deleted pod (2-4 s on a real
  // node: the kubelet's housekeeping removes it).
  absl::Duration pod_dir_linger = absl::Seconds(2);
  // How often the plugin watcher acts on what it saw in plugins_registry/.
  // The kubelet's plugin manager records each socket's creation and
  // deletion at once, and registers or deregisters at its reconciler's
  // next pass, once a second: a DRA driver or plugin is registered up to
  // a second after its socket appears (about 1 s on a real 1.37 node).
  absl::Duration watcher_period = absl::Seconds(1);
  // How often the kubelet writes the node's status, whose allocatable the
  // scheduler routes pods by (nodeStatusUpdateFrequency, 10 s by default):
  // the device manager's count changes at once, the status at the next
  // update (1.3-9.2 s later on a real 1.36 node). State shows it as
  // ResourceState.status_allocatable; zero: the status follows at once.
  absl::Duration node_status_period = absl::Seconds(10);
  // Called with the node's allocatable of every device-plugin resource at
  // each status update, as the kubelet writes it to the API server (a
  // test hands it to its simulated API server's Node). May be empty.
  std::function<void(const std::map<std::string, int64_t>&)> on_node_status;
  // Serve the container runtime's CRI (runtime.v1.RuntimeService, only
  // ListContainers) at <root_dir>/containerd/containerd.sock: every
  // container that runs (PodState.running), labelled with its pod's UID,
  // namespace and name and its own name, as the kubelet labels them. Like
  // containerd, it serves from the first Start() on, kubelet restarts
  // included, until the simulator is destroyed.
  bool container_runtime = true;
};

class KubeletSim {
 public:
  explicit KubeletSim(KubeletSimOptions options);
  ~KubeletSim();

  KubeletSim(const KubeletSim&) = delete;
  KubeletSim& operator=(const KubeletSim&) = delete;

  // Starts the kubelet part as a kubelet does: loads the checkpoint, removes
  // the sockets in device-plugins/ (up to 1.32 every non-directory file)
  // except the checkpoint, then listens on kubelet.sock (and watches
  // plugins_registry/).
  absl::Status Start();
  // Stops the kubelet part abruptly, as a killed kubelet: servers and plugin
  // streams close, nothing more is written. Idempotent.
  void Stop();
  // Stop() then Start(), optionally as another personality or release.
  absl::Status Restart(std::optional<Personality> personality = std::nullopt);
  absl::Status Restart(const KubeletVersion& kubelet);

  // The late wipe (KubeletSimOptions::late_wipe) for the starts from now on.
  void SetLateWipe(absl::Duration late_wipe);

  // Holds the device manager's checkpoint writes (true) or lets them go on
  // (false). A real kubelet writes its checkpoint after a plugin's Allocate
  // has answered; while held, the node is in that window: the plugin has
  // answered, the pod runs, the checkpoint does not list it yet. The
  // simulator's own record of its pods is written as usual.
  void HoldCheckpointWrites(bool hold);

  // Called on the admitting thread just before each Allocate goes to a
  // plugin, with the resource and the device IDs of each container in the
  // call (a test freezes the plugin there, to have a call in flight when
  // the plugin dies). Null: none.
  using AllocateHook = std::function<void(const std::string& resource,
                                          const std::vector<std::vector<std::string>>& ids)>;
  void SetBeforeAllocate(AllocateHook hook);

  // Called with the plugin's socket path just before a 1.25+ kubelet dials
  // a registering plugin back (a test re-serves the socket there, as a
  // kubelet's start wiping it mid-registration does). Null: none.
  using DialBackHook = std::function<void(const std::string& socket_path)>;
  void SetBeforeDialBack(DialBackHook hook);

  // Called with the resource on a plugin's stream thread once a device
  // list it sent has updated the device manager, outside the device
  // manager's lock, before the checkpoint is written (a test holds a list
  // there to see another plugin register meanwhile). Null: none.
  using ListHook = std::function<void(const std::string& resource)>;
  void SetBeforeListCheckpoint(ListHook hook);

  // Serves the control API on `socket_path` (outlives kubelet restarts).
  absl::Status StartControl(const std::string& socket_path);
  void StopControl();

  // Pod admission; see control.proto. Admission errors are
  // kFailedPrecondition with the kubelet's message ("Allocate failed due to
  // ..., which is unexpected"); the pod is then recorded as Failed. A pod
  // with an extended-resource claim has it prepared first; if the driver
  // fails it, the pod waits as at a real kubelet (kUnavailable naming the
  // claim, nothing recorded) and the caller may try again.
  absl::StatusOr<AllocateResponse> Allocate(const AllocateRequest& request);
  State GetState();
  ReadmitResponse Readmit();

  // DRA (1.32+): the drivers registered through the plugin watcher (GetInfo
  // type "DRAPlugin"), their health streams, and claims prepared and
  // unprepared as the kubelet calls them when a pod with those claims
  // starts or ends (dra_manager.h says how each release behaves).
  using DraDriver = DraManager::Driver;
  using DraDeviceHealth = DraManager::DeviceHealth;
  using DraClaim = DraManager::Claim;
  std::optional<DraDriver> dra_driver(const std::string& name) { return dra_.driver(name); }
  int dra_instances(const std::string& name) { return dra_.instances(name); }
  std::map<std::string, DraDeviceHealth> DraHealth(const std::string& driver) {
    return dra_.Health(driver);
  }
  absl::StatusOr<nlohmann::json> PrepareClaims(const std::string& driver,
                                               const std::vector<DraClaim>& claims) {
    return dra_.Prepare(driver, claims);
  }
  absl::StatusOr<nlohmann::json> UnprepareClaims(const std::string& driver,
                                                 const std::vector<DraClaim>& claims) {
    return dra_.Unprepare(driver, claims);
  }
  // Deletes a pod: its extended-resource claim is unprepared first; if the
  // driver fails that, the pod stays (kUnavailable naming the claim).
  absl::Status DeletePod(const std::string& uid);
  // See control.proto. kFailedPrecondition with the kubelet's message if
  // the allocation was refused (the container is then not running).
  absl::StatusOr<RestartContainerResponse> RestartContainer(const std::string& uid,
                                                            const std::string& container);
  // True once `resource` is registered and has >= min_healthy healthy devices.
  bool WaitForResource(const std::string& resource, int min_healthy,
                       absl::Duration timeout);
  // True once the kubelet has re-admitted the pods it found at its start,
  // and said so: every event of that pass, "pods_synced" last, is in
  // events().
  bool WaitForPodsSynced(absl::Duration timeout);
  // Pods found at this start and not yet re-admitted.
  std::set<std::string> UnsyncedPods();

  EventLog& events() { return events_; }
  Personality personality();
  KubeletVersion kubelet();
  std::string device_plugin_dir() const;
  std::string kubelet_socket() const;
  std::string plugins_registry_dir() const;
  std::string pod_resources_socket() const;
  // The container runtime's CRI socket (KubeletSimOptions::container_runtime).
  std::string container_runtime_socket() const;
  std::string checkpoint_path() const;
  // The simulator's own record of its pods (beside the checkpoint).
  std::string pods_path() const;

  // Implementation types, public so the .cc file's services can name them.
  struct PluginClient;
  absl::Status HandleRegister(const std::string& api_version,
                              const std::string& version, const std::string& endpoint,
                              const std::string& resource,
                              const v1beta1::DevicePluginOptions* request_options);

 private:
  class DevicePluginHandler;
  class DraPluginHandler;

  absl::Duration Grace() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunClient(std::shared_ptr<PluginClient> client);
  void OnDevices(const std::shared_ptr<PluginClient>& client,
                 const std::vector<v1beta1::Device>& devices);
  void OnClientLost(const std::shared_ptr<PluginClient>& client, const std::string& why);
  // The resource's endpoint `lost` is gone: its devices turn unhealthy
  // and its grace starts (plugin_lost), unless it is no longer current.
  void LoseEndpointLocked(const std::shared_ptr<PluginClient>& lost, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OnClientLost on a 1.37+ kubelet (TracksClientsPerSocket).
  void OnSocketClientLostLocked(const std::shared_ptr<PluginClient>& client,
                                const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DisconnectSocketLocked(const std::string& resource, const std::string& socket_path,
                              const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<PluginClient>> ConnectSync(
      const std::string& resource, const std::string& socket_path,
      const std::string& via, const std::string& watch_socket);
  absl::StatusOr<std::shared_ptr<PluginClient>> TryConnectSync(
      const std::string& resource, const std::string& socket_path,
      const std::string& via, const std::string& watch_socket);
  void ForgetClientAfterFailedConnect(const std::string& resource,
                                      const std::string& socket_path);
  void InstallClient(std::shared_ptr<PluginClient> client)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The device manager stops the resource's endpoint if it is `client`'s.
  void StopEndpoint(const std::shared_ptr<PluginClient>& client)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteCheckpointLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checkpoint and the pods file as the state is now, numbered in the
  // order they were made.
  struct CheckpointFiles {
    uint64_t seq = 0;
    std::optional<std::string> checkpoint;  // none while writes are held
    std::string pods;
  };
  CheckpointFiles CheckpointFilesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `files` unless later ones were written first; with or without
  // mu_ held. The kubelet writes its checkpoint after its device manager's
  // lock is released (writeCheckpoint), so that a large list's update does
  // not hold up another plugin's registration.
  void WriteCheckpoint(const CheckpointFiles& files) ABSL_LOCKS_EXCLUDED(checkpoint_mu_);
  void Housekeeping();
  std::unique_ptr<PluginManager::Handler> MakeDevicePluginHandler();
  std::unique_ptr<PluginManager::Handler> MakeDraPluginHandler();
  // The plugin watcher's handler of a plugin type (PluginManager).
  PluginManager::Handler* PluginHandlerFor(const std::string& type);
  // The plugin watcher saw the registration socket `path` of `resource`
  // deleted or replaced: the device manager's DeRegisterPlugin.
  void DeregisterWatcherPluginLocked(const std::string& resource, const std::string& path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AdmitPod(const AllocateRequest& request, AllocateResponse* response);
  // The devices the kubelet picks for one container: the plugin's preferred
  // allocation where offered (advice, topped up), else the first available.
  // `taken`: picked already for other containers of the same pod.
  // `reusable`: devices of the pod's init containers, offered first (as
  // must_include; used without asking when they suffice).
  absl::StatusOr<std::vector<std::string>> PickDevices(
      const ContainerRequest& c, const std::set<std::string>& taken,
      const std::vector<std::string>& reusable = {});
  // One Allocate call with a container request per entry of `ids`; the
  // client used goes to *used.
  absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>> CallAllocate(
      const std::string& resource, const std::vector<std::vector<std::string>>& ids,
      std::shared_ptr<PluginClient>* used);
  // What a kubelet does with the pods it finds bound to the node, about a
  // second after it starts (KubeletSimOptions::readmit_delay): the
  // admission check of every running pod in creation order
  // (DeviceManager::RefitRunningPods; a pod that does not fit is killed),
  // then, for a container whose devices it has no record of (a lost
  // checkpoint): from 1.25 nothing, as the container runs; before 1.25 a
  // new allocation (GetPreferredAllocation, Allocate) recorded for it,
  // while the container goes on with the devices it was started with. From
  // then on pod-resources lists those pods.
  void ReadmitAfterStart(int64_t start);
  // The kubelet's node status update, when due: status_allocatable_
  // becomes the device manager's count, and on_node_status hears it.
  void UpdateNodeStatus();

  const KubeletSimOptions options_;
  EventLog events_{"kubelet_sim"};

  // Serializes pod admission, as the kubelet admits one pod at a time.
  absl::Mutex admit_mu_;

  absl::Mutex mu_;
  KubeletVersion kubelet_ ABSL_GUARDED_BY(mu_);
  absl::Duration late_wipe_delay_ ABSL_GUARDED_BY(mu_);
  bool checkpoint_writes_held_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t checkpoint_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Mutex checkpoint_mu_ ABSL_ACQUIRED_AFTER(mu_);
  uint64_t checkpoint_written_ ABSL_GUARDED_BY(checkpoint_mu_) = 0;
  AllocateHook before_allocate_ ABSL_GUARDED_BY(mu_);
  DialBackHook before_dial_back_ ABSL_GUARDED_BY(mu_);
  ListHook before_list_checkpoint_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  int64_t starts_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time started_at_ ABSL_GUARDED_BY(mu_);
  // Pods found at this start are listed by pod-resources only once they
  // have been re-admitted (pods_synced_).
  bool pods_synced_ ABSL_GUARDED_BY(mu_) = false;
  // ... and its "pods_synced" event is out (WaitForPodsSynced).
  bool pods_synced_said_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> unsynced_pods_ ABSL_GUARDED_BY(mu_);
  // Deleted pods' directories under <root>/pods, and when they go.
  std::map<std::string, absl::Time> pod_dirs_gone_at_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  DeviceManager state_ ABSL_GUARDED_BY(mu_);
  // The allocatable the node's status shows (node_status_period), and when
  // the kubelet writes it next.
  std::map<std::string, int64_t> status_allocatable_ ABSL_GUARDED_BY(mu_);
  absl::Time status_due_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The client entered under each resource name (the registration
  // handler's map: looked up when a stream ends).
  std::map<std::string, std::shared_ptr<PluginClient>> clients_ ABSL_GUARDED_BY(mu_);
  // The endpoint each resource's calls go to (the device manager's: set by
  // a connected registration, gone when it is disconnected). Differs from
  // clients_ once a failed registration deleted the name's entry.
  std::map<std::string, std::shared_ptr<PluginClient>> endpoints_ ABSL_GUARDED_BY(mu_);
  // 1.37+ (KubeletVersion::TracksClientsPerSocket): the handler's clients
  // and the device manager's endpointStore, by resource and socket path.
  using BySocket = std::map<std::string, std::shared_ptr<PluginClient>>;
  std::map<std::string, BySocket> socket_clients_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, BySocket> endpoint_store_ ABSL_GUARDED_BY(mu_);
  // Every client whose thread may still run (current and replaced).
  std::vector<std::shared_ptr<PluginClient>> all_clients_ ABSL_GUARDED_BY(mu_);
  DraManager dra_;
  std::unique_ptr<PluginManager::Handler> device_plugin_handler_;
  std::unique_ptr<PluginManager::Handler> dra_plugin_handler_;
  // Declared after the handlers: destroyed (stopped) before them.
  PluginManager plugin_manager_;
  // Prepares the pod's extended-resource claim: what each mapped container
  // is given.
  absl::StatusOr<std::vector<RuntimeDevices>> PrepareExtendedResourceClaim(
      const AllocateRequest& req);

  std::unique_ptr<grpc::Server> registration_server_;
  std::unique_ptr<grpc::Server> pod_resources_server_;
  std::unique_ptr<grpc::Service> runtime_service_;  // the CRI: outlives kubelet restarts
  std::unique_ptr<grpc::Server> runtime_server_;
  std::unique_ptr<grpc::Server> control_server_;
  std::unique_ptr<grpc::Service> registration_service_;
  std::unique_ptr<grpc::Service> pod_resources_service_;
  std::unique_ptr<grpc::Service> control_service_;
  std::unique_ptr<grpc::CallbackGenericService> unknown_handler_;
  std::thread housekeeping_;
  std::thread late_wipe_;
  // Set while the late wipe is still to come (this start).
  std::atomic<bool> late_wipe_pending_{false};
  void LateWipe();
  absl::Mutex stop_mu_;
  bool stop_housekeeping_ ABSL_GUARDED_BY(stop_mu_) = false;
};

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_KUBELET_SIM_KUBELET_SIM_H_
