#include "tools/kubelet_sim/kubelet_sim.h"


#include <algorithm>
#include <random>
#include <set>

#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "proto/cri/api.grpc.pb.h"
#include "proto/dra/v1/api.grpc.pb.h"
#include "proto/dra/v1beta1/api.grpc.pb.h"
#include "proto/dra_health/v1/api.grpc.pb.h"
#include "proto/dra_health/v1alpha1/api.grpc.pb.h"
#include "proto/pluginregistration/api.grpc.pb.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/util/files.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/kube/kube_client.h"
#include "proxy/kube/kube_config.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/util/status_macros.h"
#include "tools/kubelet_sim/cdi_registry.h"
#include "tools/kubelet_sim/control.grpc.pb.h"
#include "tools/kubelet_sim/kubelet_texts.h"

namespace dpproxy::sim {
namespace {

constexpr char kPodsFileName[] = "kubelet_sim_pods.json";
constexpr char kUnexpectedAdmissionError[] = "UnexpectedAdmissionError";
constexpr absl::Duration kPreStartTimeout = absl::Seconds(30);
// The kubelet sets no deadline on Allocate and GetPreferredAllocation; the
// simulator uses a long one so a hung plugin cannot hang it forever.
constexpr absl::Duration kAdmissionRpcTimeout = absl::Seconds(60);

std::string NewPodUid() {
  static std::mt19937_64 rng{std::random_device{}()};
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  uint64_t a = rng(), b = rng();
  return absl::StrFormat("%08x-%04x-%04x-%04x-%012x", a >> 32, (a >> 16) & 0xffff,
                         a & 0xffff, b >> 48, b & 0xffffffffffffULL);
}

Json DevicesJson(const std::vector<v1beta1::Device>& devices) {
  Json out = Json::array();
  for (const auto& d : devices) {
    Json j = {{"id", d.id()}, {"health", d.health()}};
    if (d.has_topology()) {
      Json nodes = Json::array();
      for (const auto& n : d.topology().nodes()) nodes.push_back(n.id());
      j["numa"] = nodes;
    }
    out.push_back(j);
  }
  return out;
}

// Identity of a socket file: device, inode and change time (a socket
// removed and created again often gets its inode number back; a real
// kubelet sees the delete and the create as fsnotify events).
std::string InodeKey(const std::string& path) {
  std::optional<FileId> id = StatFileId(path);
  if (!id.has_value()) return "";
  return absl::StrCat(id->dev, ":", id->ino, ":", id->ctime_ns);
}

// Dials in short slices so that `cancelled` (checked between slices) can end
// the wait early.
absl::Status Dial(grpc::Channel* channel, absl::Duration timeout,
                  const std::function<bool()>& cancelled) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (cancelled()) return absl::CancelledError("kubelet stopping");
    absl::Duration slice = std::min(absl::Milliseconds(200), deadline - absl::Now());
    if (WaitForConnected(channel, slice).ok()) return absl::OkStatus();
  }
  return absl::DeadlineExceededError("context deadline exceeded");
}

// One container's devices and the plugin's answer, as the kubelet records
// them.
ContainerAllocation MakeAllocation(const std::string& uid, const std::string& pod_name,
                                   const std::string& pod_namespace, const std::string& container,
                                   const std::string& resource,
                                   const std::vector<std::string>& ids,
                                   const v1beta1::ContainerAllocateResponse& response) {
  ContainerAllocation a;
  a.set_pod_uid(uid);
  a.set_pod_name(pod_name);
  a.set_pod_namespace(pod_namespace);
  a.set_container(container);
  a.set_resource(resource);
  for (const std::string& id : ids) a.add_device_ids(id);
  *a.mutable_response() = response;
  return a;
}

}  // namespace

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

// --- A connection to one registered plugin ------------------------------------

struct KubeletSim::PluginClient {
  std::string resource;
  std::string socket_path;
  std::string api_version;  // "v1alpha2" or "v1beta1"
  std::string via;          // "kubelet.sock" or "plugin-watcher"
  std::string watch_socket;  // plugins_registry socket, for plugin-watcher
  v1beta1::DevicePluginOptions options;
  uint64_t generation = 0;
  bool dialled = false;  // sync registration already dialled
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> beta;
  std::unique_ptr<deviceplugin::DevicePlugin::Stub> alpha;
  std::thread thread;

  absl::Mutex mu;
  grpc::ClientContext* stream_ctx ABSL_GUARDED_BY(mu) = nullptr;
  bool cancelled ABSL_GUARDED_BY(mu) = false;

  bool IsCancelled() {
    absl::MutexLock lock(&mu);
    return cancelled;
  }
  void Cancel() {
    absl::MutexLock lock(&mu);
    cancelled = true;
    if (stream_ctx != nullptr) stream_ctx->TryCancel();
  }
};

// --- gRPC services -------------------------------------------------------------

class KubeletSim::RegistrationV1Beta1 final : public v1beta1::Registration::Service {
 public:
  explicit RegistrationV1Beta1(KubeletSim* sim) : sim_(sim) {}
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* req,
                        v1beta1::Empty*) override {
    return ToGrpcStatus(sim_->HandleRegister(std::string(kV1Beta1Version), req->version(),
                                             req->endpoint(), req->resource_name(),
                                             &req->options()));
  }

 private:
  KubeletSim* const sim_;
};

class KubeletSim::RegistrationV1Alpha final : public deviceplugin::Registration::Service {
 public:
  explicit RegistrationV1Alpha(KubeletSim* sim) : sim_(sim) {}
  grpc::Status Register(grpc::ServerContext*, const deviceplugin::RegisterRequest* req,
                        deviceplugin::Empty*) override {
    return ToGrpcStatus(sim_->HandleRegister(std::string(kV1AlphaVersion), req->version(),
                                             req->endpoint(), req->resource_name(),
                                             nullptr));
  }

 private:
  KubeletSim* const sim_;
};

class KubeletSim::PodResources final : public v1::PodResourcesLister::Service {
 public:
  explicit PodResources(KubeletSim* sim) : sim_(sim) {}

  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* resp) override {
    const State st = sim_->GetState();
    const Index index(st);
    const std::set<std::string> unsynced = sim_->UnsyncedPods();
    for (const PodState& p : st.pods()) {
      // Active pods only; right after a start, not the pods found then
      // until the kubelet has synced them (about a second).
      if (p.phase() != "Running" || unsynced.count(p.uid()) > 0) continue;
      Fill(index, p, resp->add_pod_resources());
    }
    return grpc::Status::OK;
  }

  // 1.27 behind a gate, on from 1.34: one running pod by namespace and name.
  grpc::Status Get(grpc::ServerContext*, const v1::GetPodResourcesRequest* req,
                   v1::GetPodResourcesResponse* resp) override {
    if (sim_->kubelet().minor < 34) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "unknown method Get for service v1.PodResourcesLister");
    }
    const State st = sim_->GetState();
    const std::set<std::string> unsynced = sim_->UnsyncedPods();
    for (const PodState& p : st.pods()) {
      if (p.phase() != "Running" || unsynced.count(p.uid()) > 0 ||
          p.name() != req->pod_name() || p.namespace_() != req->pod_namespace()) {
        continue;
      }
      Fill(Index(st), p, resp->mutable_pod_resources());
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("pod ", req->pod_namespace(), "/", req->pod_name(),
                                     " not found"));
  }

  grpc::Status GetAllocatableResources(grpc::ServerContext*,
                                       const v1::AllocatableResourcesRequest*,
                                       v1::AllocatableResourcesResponse* resp) override {
    return Allocatable(resp);
  }

 private:
  // The state's allocations by pod, and each device's topology.
  struct Index {
    explicit Index(const State& st) {
      for (const ResourceState& r : st.resources()) {
        for (const sim::DeviceState& d : r.devices()) devices[{r.name(), d.id()}] = &d;
      }
      for (const ContainerAllocation& a : st.allocations()) by_pod[a.pod_uid()].push_back(&a);
    }
    std::map<std::pair<std::string, std::string>, const sim::DeviceState*> devices;
    std::map<std::string, std::vector<const ContainerAllocation*>> by_pod;
  };

  // A pod as pod-resources lists it: every app container, the devices the
  // device manager gave it, and (1.34+) the devices its claims gave it.
  void Fill(const Index& index, const PodState& p, v1::PodResources* pr) {
    pr->set_name(p.name());
    pr->set_namespace_(p.namespace_());
    auto container = [&](const std::string& name) {
      for (auto& existing : *pr->mutable_containers()) {
        if (existing.name() == name) return &existing;
      }
      v1::ContainerResources* c = pr->add_containers();
      c->set_name(name);
      return c;
    };
    std::set<std::string> init_containers;  // not listed
    for (const ContainerRequest& c : p.containers()) {
      if (c.init()) {
        init_containers.insert(c.name());
      } else {
        container(c.name());
      }
    }
    auto allocations = index.by_pod.find(p.uid());
    for (const ContainerAllocation* a :
         allocations == index.by_pod.end() ? std::vector<const ContainerAllocation*>{}
                                           : allocations->second) {
      if (init_containers.count(a->container()) > 0) continue;
      v1::ContainerResources* c = container(a->container());
      // The real kubelet answers one ContainerDevices per device ID, each
      // with its own topology, not one per container and resource.
      for (const std::string& id : a->device_ids()) {
        v1::ContainerDevices* d = c->add_devices();
        d->set_resource_name(a->resource());
        d->add_device_ids(id);
        auto dev = index.devices.find({a->resource(), id});
        if (dev != index.devices.end()) {
          for (int64_t n : dev->second->numa_nodes()) d->mutable_topology()->add_nodes()->set_id(n);
        }
      }
    }
    if (!p.has_extended_resource_claim() || sim_->kubelet().minor < 34) return;
    for (const RuntimeDevices& r : p.running()) {
      if (r.claim_devices().empty()) continue;
      v1::DynamicResource* dr = container(r.container())->add_dynamic_resources();
      dr->set_claim_name(p.extended_resource_claim().name());
      dr->set_claim_namespace(p.extended_resource_claim().namespace_());
      for (int i = 0; i < r.claim_devices_size(); ++i) {
        v1::ClaimResource* cr = dr->add_claim_resources();
        cr->set_driver_name(r.claim_driver());
        cr->set_pool_name(i < r.claim_pools_size() ? r.claim_pools(i) : "");
        cr->set_device_name(r.claim_devices(i));
        // The CDI names of the container's request (the driver's answer
        // names them per request, not per device).
        for (const std::string& cdi : r.cdi_device_ids()) cr->add_cdi_devices()->set_name(cdi);
      }
    }
  }

  grpc::Status Allocatable(v1::AllocatableResourcesResponse* resp) {
    State st = sim_->GetState();
    for (const ResourceState& r : st.resources()) {
      for (const sim::DeviceState& d : r.devices()) {
        if (d.health() != kHealthy) continue;
        v1::ContainerDevices* cd = resp->add_devices();
        cd->set_resource_name(r.name());
        cd->add_device_ids(d.id());
        for (int64_t n : d.numa_nodes()) cd->mutable_topology()->add_nodes()->set_id(n);
      }
    }
    return grpc::Status::OK;
  }

  KubeletSim* const sim_;
};

class KubeletSim::Control final : public KubeletControl::Service {
 public:
  explicit Control(KubeletSim* sim) : sim_(sim) {}

  grpc::Status Allocate(grpc::ServerContext*, const AllocateRequest* req,
                        AllocateResponse* resp) override {
    absl::StatusOr<AllocateResponse> r = sim_->Allocate(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status GetState(grpc::ServerContext*, const GetStateRequest*, State* resp) override {
    *resp = sim_->GetState();
    return grpc::Status::OK;
  }
  grpc::Status Restart(grpc::ServerContext*, const RestartRequest* req, State* resp) override {
    absl::Status s;
    if (req->personality().empty()) {
      s = sim_->Restart();
    } else {
      std::optional<bool> gate;
      if (req->cdi_gate() != 0) gate = req->cdi_gate() > 0;
      absl::StatusOr<KubeletVersion> parsed = ParseKubeletVersion(req->personality(), gate);
      if (!parsed.ok()) return ToGrpcStatus(parsed.status());
      s = sim_->Restart(*parsed);
    }
    if (!s.ok()) return ToGrpcStatus(s);
    *resp = sim_->GetState();
    return grpc::Status::OK;
  }
  grpc::Status DraClaims(grpc::ServerContext*, const DraClaimsRequest* req,
                         DraClaimsResponse* resp) override {
    std::vector<KubeletSim::DraClaim> claims;
    for (const auto& c : req->claims()) claims.push_back({c.namespace_(), c.name(), c.uid()});
    absl::StatusOr<nlohmann::json> r = req->unprepare()
                                           ? sim_->UnprepareClaims(req->driver(), claims)
                                           : sim_->PrepareClaims(req->driver(), claims);
    if (!r.ok()) return ToGrpcStatus(r.status());
    resp->set_claims_json(r->dump());
    return grpc::Status::OK;
  }
  grpc::Status Readmit(grpc::ServerContext*, const ReadmitRequest*,
                       ReadmitResponse* resp) override {
    *resp = sim_->Readmit();
    return grpc::Status::OK;
  }
  grpc::Status RestartContainer(grpc::ServerContext*, const RestartContainerRequest* req,
                                RestartContainerResponse* resp) override {
    absl::StatusOr<RestartContainerResponse> r =
        sim_->RestartContainer(req->pod_uid(), req->container());
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status DeletePod(grpc::ServerContext*, const DeletePodRequest* req,
                         State* resp) override {
    if (absl::Status s = sim_->DeletePod(req->pod_uid()); !s.ok()) return ToGrpcStatus(s);
    *resp = sim_->GetState();
    return grpc::Status::OK;
  }
  grpc::Status WaitForResource(grpc::ServerContext*, const WaitForResourceRequest* req,
                               State* resp) override {
    bool ok = sim_->WaitForResource(req->resource(), req->min_healthy(),
                                    absl::Milliseconds(req->timeout_ms()));
    *resp = sim_->GetState();
    if (!ok) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("resource ", req->resource(), " did not reach ",
                                       req->min_healthy(), " healthy devices within ",
                                       req->timeout_ms(), " ms"));
    }
    return grpc::Status::OK;
  }

 private:
  KubeletSim* const sim_;
};

class KubeletSim::ContainerRuntime final : public runtime::v1::RuntimeService::Service {
 public:
  explicit ContainerRuntime(KubeletSim* sim) : sim_(sim) {}

  grpc::Status ListContainers(grpc::ServerContext*, const runtime::v1::ListContainersRequest* req,
                              runtime::v1::ListContainersResponse* resp) override {
    const State st = sim_->GetState();
    const runtime::v1::ContainerFilter& f = req->filter();
    // Only running containers are kept: any other state asked lists none.
    if (f.has_state() && f.state().state() != runtime::v1::CONTAINER_RUNNING) {
      return grpc::Status::OK;
    }
    for (const PodState& p : st.pods()) {
      if (p.phase() != "Running") continue;
      std::set<std::string> names;
      for (const RuntimeDevices& r : p.running()) names.insert(r.container());
      for (const std::string& name : names) {
        const std::string id = absl::StrCat(p.uid(), "-", name);
        if (!f.id().empty() && f.id() != id) continue;
        runtime::v1::Container c;
        c.set_id(id);
        c.set_pod_sandbox_id(p.uid());
        c.mutable_metadata()->set_name(name);
        c.set_state(runtime::v1::CONTAINER_RUNNING);
        auto& labels = *c.mutable_labels();
        labels["io.kubernetes.pod.uid"] = p.uid();
        labels["io.kubernetes.pod.name"] = p.name();
        labels["io.kubernetes.pod.namespace"] = p.namespace_();
        labels["io.kubernetes.container.name"] = name;
        bool selected = f.pod_sandbox_id().empty() || f.pod_sandbox_id() == p.uid();
        for (const auto& [k, v] : f.label_selector()) {
          auto it = labels.find(k);
          selected = selected && it != labels.end() && it->second == v;
        }
        if (selected) *resp->add_containers() = std::move(c);
      }
    }
    return grpc::Status::OK;
  }

 private:
  KubeletSim* const sim_;
};

// --- KubeletSim -----------------------------------------------------------------

KubeletSim::KubeletSim(KubeletSimOptions options)
    : options_(std::move(options)),
      kubelet_(options_.kubelet.value_or(KubeletVersionOf(options_.personality))),
      late_wipe_delay_(options_.late_wipe) {}

void KubeletSim::SetLateWipe(absl::Duration late_wipe) {
  absl::MutexLock lock(&mu_);
  late_wipe_delay_ = late_wipe;
}

void KubeletSim::HoldCheckpointWrites(bool hold) {
  absl::MutexLock lock(&mu_);
  checkpoint_writes_held_ = hold;
}

KubeletSim::~KubeletSim() {
  StopControl();
  Stop();
  if (runtime_server_) {
    runtime_server_->Shutdown(std::chrono::system_clock::now());
    runtime_server_->Wait();
    runtime_server_.reset();
  }
}

std::string KubeletSim::device_plugin_dir() const {
  return JoinPath(options_.root_dir, "device-plugins");
}
std::string KubeletSim::kubelet_socket() const {
  return JoinPath(device_plugin_dir(), kKubeletSocketName);
}
std::string KubeletSim::plugins_registry_dir() const {
  return JoinPath(options_.root_dir, "plugins_registry");
}
std::string KubeletSim::pod_resources_socket() const {
  return JoinPath(JoinPath(options_.root_dir, "pod-resources"), "kubelet.sock");
}
std::string KubeletSim::container_runtime_socket() const {
  return JoinPath(JoinPath(options_.root_dir, "containerd"), "containerd.sock");
}
std::string KubeletSim::pods_path() const { return JoinPath(options_.root_dir, kPodsFileName); }

std::string KubeletSim::checkpoint_path() const {
  return JoinPath(device_plugin_dir(), kKubeletCheckpointName);
}

Personality KubeletSim::personality() {
  absl::MutexLock lock(&mu_);
  return kubelet_.personality;
}

KubeletVersion KubeletSim::kubelet() {
  absl::MutexLock lock(&mu_);
  return kubelet_;
}

absl::Duration KubeletSim::Grace() const {
  if (options_.endpoint_grace.has_value()) return *options_.endpoint_grace;
  return kubelet_.personality == Personality::kV1Alpha ? absl::ZeroDuration()
                                                      : absl::Minutes(5);
}

absl::Status KubeletSim::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (running_) return absl::OkStatus();
  }
  DPP_RETURN_IF_ERROR(ValidateSocketPath(kubelet_socket()));
  if (options_.pod_resources) DPP_RETURN_IF_ERROR(ValidateSocketPath(pod_resources_socket()));
  DPP_RETURN_IF_ERROR(MakeDirs(device_plugin_dir()));
  DPP_RETURN_IF_ERROR(MakeDirs(plugins_registry_dir()));
  if (options_.pod_resources) {
    DPP_RETURN_IF_ERROR(MakeDirs(JoinPath(options_.root_dir, "pod-resources")));
  }

  // Allocation state first, as the kubelet reads its checkpoint at start.
  std::string checkpoint, pods;
  if (absl::StatusOr<std::string> c = ReadFile(checkpoint_path()); c.ok()) checkpoint = *c;
  if (absl::StatusOr<std::string> p = ReadFile(JoinPath(options_.root_dir, kPodsFileName));
      p.ok()) {
    pods = *p;
  }
  KubeletVersion kubelet;
  size_t restored_allocations = 0, restored_resources = 0;
  {
    absl::MutexLock lock(&mu_);
    kubelet = kubelet_;
    absl::Status s = state_.Restore(checkpoint, pods, absl::Now(), kubelet.minor);
    if (!s.ok()) {
      events_.Emit("checkpoint_unreadable",
                   {{"error", std::string(s.message())},
                    {"note", "Continue after failing to read checkpoint file. Device "
                             "allocation info may NOT be up-to-date"}});
    }
    restored_allocations = state_.allocations().size();
    restored_resources = state_.ResourceNames().size();
  }

  if (kubelet.minor >= 32 && !options_.kubeconfig.empty()) DeleteNodeSlices();

  // Remove every non-directory entry but the checkpoint: plugins see their
  // sockets vanish and know the kubelet restarted.
  absl::StatusOr<std::vector<std::string>> removed =
      RemoveFilesExcept(device_plugin_dir(), {std::string(kKubeletCheckpointName)});
  if (!removed.ok()) return removed.status();
  events_.Emit("directory_cleaned", {{"dir", device_plugin_dir()}, {"removed", *removed}});
  const Personality personality = kubelet.personality;
  if (kubelet.plugin_watcher) {
    DPP_RETURN_IF_ERROR(WriteFileAtomic(
        JoinPath(device_plugin_dir(), kDeprecationMarkerName), ""));
  }

  {
    absl::MutexLock lock(&mu_);
    running_ = true;
    ++starts_;
    started_at_ = absl::Now();
    status_due_ = started_at_;  // a starting kubelet writes the node's status at once
    pods_synced_ = false;
    unsynced_pods_.clear();
    for (const auto& [uid, pod] : state_.pods()) unsynced_pods_.insert(uid);
  }

  std::vector<std::string> served;
  if (personality == Personality::kV1Alpha) {
    registration_service_ = std::make_unique<RegistrationV1Alpha>(this);
    served = {"deviceplugin.Registration"};
  } else {
    registration_service_ = std::make_unique<RegistrationV1Beta1>(this);
    served = {"v1beta1.Registration"};
  }
  unknown_handler_ = std::make_unique<GoStyleUnknownHandler>(
      served, [this](const std::string& method, const std::string& error) {
        events_.Emit("unknown_call", {{"socket", kubelet_socket()},
                                      {"method", method},
                                      {"error", error}});
      });
  // A late cleanup is due from the moment kubelet.sock exists: a plugin
  // that registers at once must meet it.
  const absl::Duration late_wipe = [this] {
    absl::MutexLock lock(&mu_);
    return late_wipe_delay_;
  }();
  late_wipe_pending_ = late_wipe > absl::ZeroDuration();
  {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(UnixAddress(kubelet_socket()), grpc::InsecureServerCredentials());
    builder.RegisterService(registration_service_.get());
    builder.RegisterCallbackGenericService(unknown_handler_.get());
    registration_server_ = builder.BuildAndStart();
  }
  if (registration_server_ == nullptr) {
    late_wipe_pending_ = false;
    absl::MutexLock lock(&mu_);
    running_ = false;
    return absl::UnavailableError(absl::StrCat("cannot listen on ", kubelet_socket()));
  }
  if (options_.pod_resources) {
    pod_resources_service_ = std::make_unique<PodResources>(this);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(UnixAddress(pod_resources_socket()),
                             grpc::InsecureServerCredentials());
    builder.RegisterService(pod_resources_service_.get());
    pod_resources_server_ = builder.BuildAndStart();
    if (pod_resources_server_ == nullptr) {
      Stop();
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", pod_resources_socket()));
    }
  }
  if (options_.container_runtime && runtime_server_ == nullptr) {
    DPP_RETURN_IF_ERROR(MakeDirs(JoinPath(options_.root_dir, "containerd")));
    ::unlink(container_runtime_socket().c_str());
    runtime_service_ = std::make_unique<ContainerRuntime>(this);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(UnixAddress(container_runtime_socket()),
                             grpc::InsecureServerCredentials());
    builder.RegisterService(runtime_service_.get());
    runtime_server_ = builder.BuildAndStart();
    if (runtime_server_ == nullptr) {
      Stop();
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", container_runtime_socket()));
    }
  }
  {
    absl::MutexLock lock(&stop_mu_);
    stop_housekeeping_ = false;
  }
  housekeeping_ = std::thread([this] { Housekeeping(); });
  if (late_wipe > absl::ZeroDuration()) {
    late_wipe_ = std::thread([this, late_wipe] {
      {
        absl::MutexLock lock(&stop_mu_);
        if (stop_mu_.AwaitWithTimeout(absl::Condition(&stop_housekeeping_), late_wipe)) {
          return;  // stopped first
        }
      }
      LateWipe();
    });
  }
  if (kubelet.plugin_watcher) {
    // Events only record deletions; Housekeeping reconciles at each
    // watcher_period, as the kubelet's plugin manager does.
    watcher_ = std::make_unique<DirWatcher>(
        plugins_registry_dir(), [this](const DirWatcher::Event& e) {
          if (e.kind == DirWatcher::Event::kDeleted) {
            absl::MutexLock lock(&mu_);
            deleted_.insert(JoinPath(plugins_registry_dir(), e.name));
          }
        });
    DPP_RETURN_IF_ERROR(watcher_->Start());
  }
  int64_t starts;
  {
    absl::MutexLock lock(&mu_);
    starts = starts_;
  }
  events_.Emit("kubelet_started", {{"personality", PersonalityName(personality)},
                                   {"kubelet", kubelet.name},
                                   {"generation", kubelet.GenerationName()},
                                   {"plugin_watcher", kubelet.plugin_watcher},
                                   {"socket", kubelet_socket()},
                                   {"starts", starts},
                                   {"restored_allocations", restored_allocations},
                                   {"restored_resources", restored_resources}});
  return absl::OkStatus();
}

void KubeletSim::Stop() {
  std::vector<std::shared_ptr<PluginClient>> clients;
  std::map<std::string, std::unique_ptr<HealthWatch>> health;
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    running_ = false;
    clients.swap(all_clients_);
    clients_.clear();
    endpoints_.clear();
    socket_clients_.clear();
    endpoint_store_.clear();
    watched_.clear();
    deleted_.clear();
    // Drivers register again through the plugin watcher after a start.
    dra_drivers_.clear();
    dra_older_.clear();
    health.swap(health_watches_);
  }
  for (auto& [driver, w] : health) StopHealthWatch(std::move(w));
  {
    absl::MutexLock lock(&mu_);
    dra_health_.clear();  // a kubelet's memory, once no stream writes it
  }
  if (watcher_) {
    watcher_->Stop();
    watcher_.reset();
  }
  for (auto& c : clients) c->Cancel();
  if (registration_server_) {
    registration_server_->Shutdown(std::chrono::system_clock::now());
    registration_server_->Wait();
    registration_server_.reset();
  }
  if (pod_resources_server_) {
    pod_resources_server_->Shutdown(std::chrono::system_clock::now());
    pod_resources_server_->Wait();
    pod_resources_server_.reset();
  }
  for (auto& c : clients) {
    if (c->thread.joinable()) c->thread.join();
  }
  {
    absl::MutexLock lock(&stop_mu_);
    stop_housekeeping_ = true;
  }
  late_wipe_pending_ = false;
  if (housekeeping_.joinable()) housekeeping_.join();
  if (late_wipe_.joinable()) late_wipe_.join();
  events_.Emit("kubelet_stopped", {{"socket", kubelet_socket()}});
}

absl::Status KubeletSim::Restart(std::optional<Personality> personality) {
  Stop();
  if (personality.has_value()) {
    absl::MutexLock lock(&mu_);
    kubelet_ = KubeletVersionOf(*personality);
  }
  return Start();
}

absl::Status KubeletSim::Restart(const KubeletVersion& kubelet) {
  Stop();
  {
    absl::MutexLock lock(&mu_);
    // The per-socket tracking is the simulator's setting, not a release's.
    const bool per_socket = kubelet_.per_socket_clients;
    kubelet_ = kubelet;
    kubelet_.per_socket_clients = per_socket;
  }
  return Start();
}

absl::Status KubeletSim::StartControl(const std::string& socket_path) {
  DPP_RETURN_IF_ERROR(ValidateSocketPath(socket_path));
  control_service_ = std::make_unique<Control>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(UnixAddress(socket_path), grpc::InsecureServerCredentials());
  // A node's whole state (every device, pod and allocation) in one answer:
  // 260,000 devices make some 6 MB.
  builder.SetMaxSendMessageSize(kControlMaxMessageBytes);
  builder.SetMaxReceiveMessageSize(kControlMaxMessageBytes);
  builder.RegisterService(control_service_.get());
  control_server_ = builder.BuildAndStart();
  if (control_server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", socket_path));
  }
  return absl::OkStatus();
}

void KubeletSim::StopControl() {
  if (control_server_) {
    control_server_->Shutdown(std::chrono::system_clock::now() +
                              std::chrono::milliseconds(500));
    control_server_->Wait();
    control_server_.reset();
  }
}

void KubeletSim::LateWipe() {
  if (!late_wipe_pending_.exchange(false)) return;  // once per start
  absl::StatusOr<std::vector<std::string>> removed = RemoveFilesExcept(
      device_plugin_dir(), {std::string(kKubeletCheckpointName), std::string(kKubeletSocketName),
                            std::string(kDeprecationMarkerName)});
  if (removed.ok()) {
    events_.Emit("directory_cleaned",
                 {{"dir", device_plugin_dir()}, {"removed", *removed}, {"late", true}});
  }
}

void KubeletSim::Housekeeping() {
  // The plugin watcher's first pass comes one period after the start.
  absl::Time watcher_due = absl::Now() + options_.watcher_period;
  for (;;) {
    // Once a second, when the re-admission of the pods found at start is
    // due, and at each pass of the plugin watcher.
    absl::Duration wait = std::min(absl::Seconds(1), watcher_due - absl::Now());
    int64_t start = 0;
    {
      absl::MutexLock lock(&mu_);
      if (running_ && options_.node_status_period > absl::ZeroDuration()) {
        wait = std::min(wait, status_due_ - absl::Now());
      }
      if (running_ && !pods_synced_) {
        wait = std::min(wait, started_at_ + options_.readmit_delay - absl::Now());
        start = starts_;
      }
    }
    {
      absl::MutexLock lock(&stop_mu_);
      if (wait > absl::ZeroDuration()) {
        stop_mu_.AwaitWithTimeout(absl::Condition(&stop_housekeeping_), wait);
      }
      if (stop_housekeeping_) return;
    }
    if (start != 0) {
      bool due = false;
      {
        absl::MutexLock lock(&mu_);
        due = running_ && !pods_synced_ && starts_ == start &&
              absl::Now() >= started_at_ + options_.readmit_delay;
      }
      if (due) ReadmitAfterStart(start);
    }
    UpdateNodeStatus();
    if (absl::Now() >= watcher_due) {
      watcher_due = absl::Now() + options_.watcher_period;
      bool watching = false;
      {
        absl::MutexLock lock(&mu_);
        watching = running_ && kubelet_.plugin_watcher;
      }
      if (watching) ReconcileWatcher();
    }
    absl::MutexLock lock(&mu_);
    if (!running_) continue;
    const absl::Time now = absl::Now();
    for (auto it = pod_dirs_gone_at_.begin(); it != pod_dirs_gone_at_.end();) {
      if (now < it->second) {
        ++it;
        continue;
      }
      (void)::rmdir(JoinPath(JoinPath(options_.root_dir, "pods"), it->first).c_str());
      events_.Emit("pod_dir_removed", {{"pod_uid", it->first}});
      it = pod_dirs_gone_at_.erase(it);
    }
    std::vector<std::string> removed = state_.ExpireResources(now, Grace());
    for (const std::string& r : removed) {
      events_.Emit("resource_removed",
                   {{"resource", r}, {"reason", "grace period after plugin loss ended"}});
    }
    if (!removed.empty()) WriteCheckpointLocked();
  }
}

void KubeletSim::ReadmitAfterStart(int64_t start) {
  absl::MutexLock admit(&admit_mu_);
  std::vector<DeviceManager::RefitResult> results;
  KubeletVersion kubelet;
  {
    absl::MutexLock lock(&mu_);
    if (!running_ || starts_ != start || pods_synced_) return;
    results = state_.RefitRunningPods();
    kubelet = kubelet_;
  }
  int admitted = 0, denied = 0, reallocated = 0, failed = 0;
  for (const DeviceManager::RefitResult& r : results) {
    if (!r.admitted) {
      ++denied;
      events_.Emit("readmission_denied", {{"pod", r.pod_name},
                                          {"pod_uid", r.pod_uid},
                                          {"reason", r.reason},
                                          {"message", r.message},
                                          {"note", "Pod admission denied; killing its containers"}});
      continue;
    }
    ++admitted;
    std::string error;
    std::set<std::string> taken;
    for (const ContainerRequest& c : r.forgotten) {
      bool runs = false;
      {
        absl::MutexLock lock(&mu_);
        if (const PodState* p = state_.FindPod(r.pod_uid); p != nullptr) {
          for (const RuntimeDevices& run : p->running()) runs |= run.container() == c.name();
        }
      }
      if (kubelet.minor >= 25 && runs) {
        // kubernetes#118635: a container the runtime reports running is
        // left alone; its devices stay unknown to the kubelet.
        events_.Emit("container_running", {{"pod", r.pod_name},
                                           {"pod_uid", r.pod_uid},
                                           {"container", c.name()},
                                           {"resource", c.resource()},
                                           {"note", "Container detected running, nothing to do"}});
        continue;
      }
      // Before 1.25 the kubelet allocates again for a container it holds
      // nothing for, running or not; from 1.25 for one that does not run
      // (a container that never started: observed on a 1.36.2 node).
      absl::StatusOr<std::vector<std::string>> ids = PickDevices(c, taken);
      absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>> resp =
          ids.ok() ? CallAllocate(c.resource(), {*ids}, nullptr)
                   : absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>>(ids.status());
      if (!resp.ok()) {
        error = std::string(resp.status().message());
        break;
      }
      taken.insert(ids->begin(), ids->end());
      const ContainerAllocation a = MakeAllocation(r.pod_uid, r.pod_name, r.pod_namespace,
                                                   c.name(), c.resource(), *ids, (*resp)[0]);
      {
        absl::MutexLock lock(&mu_);
        state_.AddAllocation(a);
      }
      ++reallocated;
      events_.Emit("reallocated", {{"pod", r.pod_name},
                                   {"pod_uid", r.pod_uid},
                                   {"container", c.name()},
                                   {"resource", c.resource()},
                                   {"devices", *ids}});
    }
    if (!error.empty()) {
      ++failed;
      const std::string message = absl::StrCat("Allocate failed due to ", error,
                                               ", which is unexpected");
      {
        absl::MutexLock lock(&mu_);
        state_.FailPod(r.pod_uid, kUnexpectedAdmissionError, message);
      }
      events_.Emit("readmission_failed", {{"pod", r.pod_name},
                                          {"pod_uid", r.pod_uid},
                                          {"reason", kUnexpectedAdmissionError},
                                          {"message", message}});
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (starts_ == start) {
      pods_synced_ = true;
      unsynced_pods_.clear();
    }
    WriteCheckpointLocked();
  }
  events_.Emit("pods_synced", {{"admitted", admitted},
                               {"denied", denied},
                               {"reallocated", reallocated},
                               {"failed", failed}});
}

void KubeletSim::WriteCheckpointLocked() {
  absl::Status s = checkpoint_writes_held_
                       ? absl::OkStatus()
                       : WriteFileAtomic(checkpoint_path(), state_.CheckpointJson(kubelet_.minor));
  if (s.ok()) {
    s = WriteFileAtomic(JoinPath(options_.root_dir, kPodsFileName), state_.PodsJson());
  }
  if (!s.ok()) events_.Emit("checkpoint_write_failed", {{"error", std::string(s.message())}});
}

void KubeletSim::StopEndpoint(const std::shared_ptr<PluginClient>& client) {
  auto it = endpoints_.find(client->resource);
  if (it != endpoints_.end() && it->second == client) endpoints_.erase(it);
}

void KubeletSim::InstallClient(std::shared_ptr<PluginClient> client) {
  // A release before 1.19 has no get_preferred_allocation_available field.
  if (!kubelet_.CallsGetPreferredAllocation()) {
    client->options.clear_get_preferred_allocation_available();
  }
  state_.RegisterEndpoint(client->resource, client->socket_path, client->api_version,
                          client->via, client->options, client->generation);
  if (kubelet_.TracksClientsPerSocket()) {
    // Joins the resource's other clients and becomes its endpoint.
    socket_clients_[client->resource][client->socket_path] = client;
    endpoint_store_[client->resource][client->socket_path] = client;
    clients_[client->resource] = client;
    endpoints_[client->resource] = client;
    return;
  }
  auto it = clients_.find(client->resource);
  if (it != clients_.end() && it->second != client) {
    // 1.9 stops the replaced endpoint. From 1.10 the new one simply takes
    // the resource's place and the old one runs until its plugin ends the
    // stream (1.10-1.24: its end is ignored, as it is no longer current;
    // 1.25-1.36 keep the client too, kubernetes#124716, and its end tears
    // down the resource's client by name). (kubernetes#121994).
    const bool keep_old = kubelet_.minor >= 10;
    events_.Emit("endpoint_replaced", {{"resource", client->resource},
                                       {"old_endpoint", it->second->socket_path},
                                       {"new_endpoint", client->socket_path},
                                       {"old_stopped", !keep_old},
                                       {"per_socket", kubelet_.per_socket_clients}});
    if (!keep_old) it->second->Cancel();
  }
  clients_[client->resource] = client;
  endpoints_[client->resource] = client;
}

absl::Status KubeletSim::HandleRegister(const std::string& api_version,
                                        const std::string& version,
                                        const std::string& endpoint,
                                        const std::string& resource,
                                        const v1beta1::DevicePluginOptions* request_options) {
  Personality personality;
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("kubelet is stopping");
    personality = kubelet_.personality;
  }
  LateWipe();  // if one is still to come, it lands now, before the dial
  // Whether the plugin's socket accepts a connection as its Register
  // arrives: an observation only (1.25+ kubelets need it, older ones dial
  // later), for tools that report on plugins.
  const bool listening = SocketAccepts(JoinPath(device_plugin_dir(), endpoint));
  events_.Emit("register_request", {{"resource", resource},
                                    {"version", version},
                                    {"endpoint", endpoint},
                                    {"endpoint_listening", listening},
                                    {"service", api_version == kV1Beta1Version
                                                    ? "v1beta1.Registration"
                                                    : "deviceplugin.Registration"}});
  auto reject = [&](absl::Status s) {
    events_.Emit("registration_rejected",
                 {{"resource", resource}, {"version", version},
                  {"error", std::string(s.message())}});
    return s;
  };
  absl::Status s = api_version == kV1AlphaVersion ? CheckV1AlphaVersion(version)
                                                  : CheckV1Beta1Version(version);
  if (!s.ok()) return reject(s);
  if (s = CheckResourceName(resource); !s.ok()) return reject(s);
  const std::string socket_path = JoinPath(device_plugin_dir(), endpoint);

  const bool sync = personality == Personality::kV1Beta1Sync ||
                    personality == Personality::kPluginWatcher;
  if (sync) {
    absl::StatusOr<std::shared_ptr<PluginClient>> c =
        ConnectSync(resource, socket_path, "kubelet.sock", "");
    if (!c.ok()) return reject(c.status());
  } else {
    auto client = std::make_shared<PluginClient>();
    client->resource = resource;
    client->socket_path = socket_path;
    client->api_version = version;
    client->via = "kubelet.sock";
    if (request_options != nullptr) client->options = *request_options;
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("kubelet is stopping");
    client->generation = next_generation_++;
    all_clients_.push_back(client);
    client->thread = std::thread([this, client] { RunClient(client); });
  }
  events_.Emit("registered", {{"resource", resource},
                              {"endpoint", socket_path},
                              {"api_version", version},
                              {"via", "kubelet.sock"},
                              {"mode", sync ? "sync" : "async"}});
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<KubeletSim::PluginClient>> KubeletSim::ConnectSync(
    const std::string& resource, const std::string& socket_path, const std::string& via,
    const std::string& watch_socket) {
  absl::StatusOr<std::shared_ptr<PluginClient>> c =
      TryConnectSync(resource, socket_path, via, watch_socket);
  if (!c.ok()) ForgetClientAfterFailedConnect(resource, socket_path);
  return c;
}

void KubeletSim::ForgetClientAfterFailedConnect(const std::string& resource,
                                                const std::string& socket_path) {
  // 1.25+ enter the new client under the resource name before they dial it
  // and delete the name's entry when the dial or GetDevicePluginOptions
  // fails: whatever client held the name is no longer listed. It keeps
  // running (its stream still feeds the devices, its endpoint still takes
  // Allocates), but when its stream ends no client of that name is found
  // and nothing is disconnected (handler.go connectClient/deregisterClient).
  // With clients tracked per socket, only an entry at the failed socket
  // goes.
  absl::MutexLock lock(&mu_);
  if (kubelet_.TracksClientsPerSocket()) {
    // Every entry of the failed socket goes, a connected client there too.
    auto clients = socket_clients_.find(resource);
    if (clients == socket_clients_.end()) return;
    auto c = clients->second.find(socket_path);
    if (c == clients->second.end()) return;
    events_.Emit("client_forgotten", {{"resource", resource},
                                      {"endpoint", socket_path},
                                      {"failed_endpoint", socket_path}});
    clients->second.erase(c);
    if (clients->second.empty()) socket_clients_.erase(clients);
    return;
  }
  auto it = clients_.find(resource);
  if (it == clients_.end()) return;
  if (kubelet_.per_socket_clients && it->second->socket_path != socket_path) return;
  events_.Emit("client_forgotten", {{"resource", resource},
                                    {"endpoint", it->second->socket_path},
                                    {"failed_endpoint", socket_path}});
  clients_.erase(it);
}

absl::StatusOr<std::shared_ptr<KubeletSim::PluginClient>> KubeletSim::TryConnectSync(
    const std::string& resource, const std::string& socket_path, const std::string& via,
    const std::string& watch_socket) {
  if (absl::Status s = ValidateSocketPath(socket_path); !s.ok()) {
    return absl::UnknownError(absl::StrCat("failed to dial device plugin: ", s.message()));
  }
  auto client = std::make_shared<PluginClient>();
  client->resource = resource;
  client->socket_path = socket_path;
  client->api_version = std::string(kV1Beta1Version);
  client->via = via;
  client->watch_socket = watch_socket;
  client->dialled = true;
  client->channel = MakeUnixChannel(socket_path);
  auto stopping = [this] {
    absl::MutexLock lock(&mu_);
    return !running_;
  };
  if (absl::Status s = Dial(client->channel.get(), options_.dial_timeout, stopping);
      !s.ok()) {
    return absl::UnknownError(absl::StrCat("failed to dial device plugin: ", s.message()));
  }
  client->beta = v1beta1::DevicePlugin::NewStub(client->channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.dial_timeout));
  grpc::Status st = client->beta->GetDevicePluginOptions(&ctx, v1beta1::Empty(),
                                                         &client->options);
  if (!st.ok()) {
    return absl::UnknownError(
        absl::StrCat("failed to get device plugin options: ", GoRpcError(st)));
  }
  absl::MutexLock lock(&mu_);
  if (!running_) return absl::UnavailableError("kubelet is stopping");
  if (kubelet_.TracksClientsPerSocket()) {
    auto store = endpoint_store_.find(resource);
    if (store != endpoint_store_.end() && store->second.count(socket_path) > 0) {
      return absl::UnknownError(
          absl::StrCat("device plugin already connected: ", socket_path));
    }
  }
  client->generation = next_generation_++;
  InstallClient(client);
  all_clients_.push_back(client);
  client->thread = std::thread([this, client] { RunClient(client); });
  return client;
}

void KubeletSim::RunClient(std::shared_ptr<PluginClient> client) {
  if (!client->dialled) {
    // Asynchronous registration: the kubelet dials after Register returned,
    // and a plugin it cannot reach is simply not registered.
    if (absl::Status s = ValidateSocketPath(client->socket_path); !s.ok()) {
      events_.Emit("plugin_dial_failed", {{"resource", client->resource},
                                          {"endpoint", client->socket_path},
                                          {"error", std::string(s.message())}});
      return;
    }
    client->channel = MakeUnixChannel(client->socket_path);
    absl::Status s = Dial(client->channel.get(), options_.dial_timeout,
                          [&] { return client->IsCancelled(); });
    if (!s.ok()) {
      if (!client->IsCancelled()) {
        events_.Emit("plugin_dial_failed",
                     {{"resource", client->resource},
                      {"endpoint", client->socket_path},
                      {"error", absl::StrCat("failed to dial device plugin: ", s.message())}});
      }
      return;
    }
    if (client->api_version == kV1AlphaVersion) {
      client->alpha = deviceplugin::DevicePlugin::NewStub(client->channel);
    } else {
      client->beta = v1beta1::DevicePlugin::NewStub(client->channel);
    }
    absl::MutexLock lock(&mu_);
    if (!running_ || client->IsCancelled()) return;
    InstallClient(client);
  }
  events_.Emit("plugin_connected", {{"resource", client->resource},
                                    {"endpoint", client->socket_path},
                                    {"api_version", client->api_version},
                                    {"pre_start_required", client->options.pre_start_required()},
                                    {"get_preferred_allocation_available",
                                     client->options.get_preferred_allocation_available()}});
  grpc::ClientContext ctx;
  {
    absl::MutexLock lock(&client->mu);
    if (client->cancelled) return;
    client->stream_ctx = &ctx;
  }
  grpc::Status status;
  if (client->beta) {
    auto reader = client->beta->ListAndWatch(&ctx, v1beta1::Empty());
    v1beta1::ListAndWatchResponse resp;
    while (reader->Read(&resp)) {
      OnDevices(client, {resp.devices().begin(), resp.devices().end()});
    }
    status = reader->Finish();
  } else {
    auto reader = client->alpha->ListAndWatch(&ctx, deviceplugin::Empty());
    deviceplugin::ListAndWatchResponse resp;
    while (reader->Read(&resp)) {
      std::vector<v1beta1::Device> devices;
      for (const auto& d : resp.devices()) {
        v1beta1::Device b;
        b.set_id(d.id());
        b.set_health(d.health());
        devices.push_back(std::move(b));
      }
      OnDevices(client, devices);
    }
    status = reader->Finish();
  }
  {
    absl::MutexLock lock(&client->mu);
    client->stream_ctx = nullptr;
  }
  OnClientLost(client, DescribeGrpcStatus(status));
}

void KubeletSim::OnDevices(const std::shared_ptr<PluginClient>& client,
                           const std::vector<v1beta1::Device>& devices) {
  absl::MutexLock lock(&mu_);
  if (!running_) return;
  // Before 1.16 Device had no topology field: the kubelet never saw it.
  std::vector<v1beta1::Device> without_topology;
  const std::vector<v1beta1::Device>* read = &devices;
  if (!kubelet_.ReadsTopology()) {
    without_topology = devices;
    for (v1beta1::Device& d : without_topology) d.clear_topology();
    read = &without_topology;
  }
  // From 1.10 a replaced client keeps running (InstallClient), and its
  // lists reach the device manager by the resource's name (on a real
  // 1.36.3 node a list from the old dpproxy's stream, after the new one's
  // client had died, turned the devices Healthy again while every
  // Allocate failed on the stopped endpoint).
  const bool by_name = kubelet_.minor >= 10;
  if (!state_.UpdateDevices(client->resource, client->generation, by_name, *read)) return;
  events_.Emit("devices", {{"resource", client->resource},
                           {"devices", DevicesJson(*read)},
                           {"capacity", state_.Capacity(client->resource)},
                           {"allocatable", state_.Allocatable(client->resource)}});
  WriteCheckpointLocked();
}

void KubeletSim::OnClientLost(const std::shared_ptr<PluginClient>& client,
                              const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (!running_) return;
  if (kubelet_.TracksClientsPerSocket()) return OnSocketClientLostLocked(client, why);
  auto it = clients_.find(client->resource);
  if (it == clients_.end()) {
    // A client no longer listed under its name (a failed registration
    // deleted the entry): its end disconnects nothing.
    events_.Emit("unlisted_client_ended",
                 {{"resource", client->resource}, {"endpoint", client->socket_path}});
    return;
  }
  std::shared_ptr<PluginClient> lost = client;
  std::string reason = why;
  if (it->second != client) {
    // A replaced client's end, recorded whatever it does: tools wait for it.
    auto ended = [&](const char* outcome) {
      events_.Emit("replaced_client_ended", {{"resource", client->resource},
                                             {"endpoint", client->socket_path},
                                             {"outcome", outcome}});
    };
    if (!kubelet_.TearsDownByName()) return ended("ignored");  // no longer current
    // #135437: the ended client's socket names what to disconnect.
    if (kubelet_.per_socket_clients && it->second->socket_path != client->socket_path) {
      return ended("ignored (another socket)");
    }
    ended("disconnected the resource's client by name");
    // 1.25-1.36: the ended client's goroutine looks the client up by
    // resource name and disconnects whatever it finds: the new one.
    lost = it->second;
    reason = absl::StrCat("the replaced client at ", client->socket_path,
                          " ended, and the kubelet disconnected the resource's client by "
                          "name (kubernetes#121994)");
    lost->Cancel();
  }
  clients_.erase(it);
  LoseEndpointLocked(lost, reason);
}

void KubeletSim::LoseEndpointLocked(const std::shared_ptr<PluginClient>& lost,
                                    const std::string& reason) {
  StopEndpoint(lost);
  if (!state_.EndpointLost(lost->resource, lost->generation, absl::Now())) return;
  events_.Emit("plugin_lost", {{"resource", lost->resource},
                               {"endpoint", lost->socket_path},
                               {"reason", reason},
                               {"grace_seconds", absl::ToInt64Seconds(Grace())}});
  for (const std::string& r : state_.ExpireResources(absl::Now(), Grace())) {
    events_.Emit("resource_removed", {{"resource", r}, {"reason", "plugin lost"}});
  }
  WriteCheckpointLocked();
}

void KubeletSim::OnSocketClientLostLocked(const std::shared_ptr<PluginClient>& client,
                                          const std::string& why) {
  auto clients = socket_clients_.find(client->resource);
  if (clients == socket_clients_.end() || clients->second.count(client->socket_path) == 0 ||
      clients->second.at(client->socket_path) != client) {
    // Not in the handler's list (a refused registration at its socket
    // deleted it): its end disconnects nothing, and the device manager
    // keeps its endpoint.
    events_.Emit("unlisted_client_ended",
                 {{"resource", client->resource}, {"endpoint", client->socket_path}});
    return;
  }
  clients->second.erase(client->socket_path);
  if (clients->second.empty()) socket_clients_.erase(clients);
  if (auto c = clients_.find(client->resource); c != clients_.end() && c->second == client) {
    clients_.erase(c);
  }
  DisconnectSocketLocked(client->resource, client->socket_path, why);
}

void KubeletSim::DisconnectSocketLocked(const std::string& resource,
                                        const std::string& socket_path,
                                        const std::string& why) {
  // PluginDisconnected: this socket's endpoint leaves the store; the last
  // one marks the resource unhealthy, else a remaining one, whichever,
  // becomes the endpoint (even one whose client has ended).
  auto store = endpoint_store_.find(resource);
  if (store == endpoint_store_.end() || store->second.count(socket_path) == 0) return;
  std::shared_ptr<PluginClient> lost = store->second.at(socket_path);
  store->second.erase(socket_path);
  if (!store->second.empty()) {
    std::shared_ptr<PluginClient> next = store->second.begin()->second;
    endpoints_[resource] = next;
    state_.RegisterEndpoint(resource, next->socket_path, next->api_version, next->via,
                            next->options, next->generation);
    events_.Emit("endpoint_promoted", {{"resource", resource},
                                       {"lost_endpoint", socket_path},
                                       {"endpoint", next->socket_path}});
    return;
  }
  endpoint_store_.erase(store);
  LoseEndpointLocked(lost, why);
}

void KubeletSim::ReconcileWatcher() {
  const std::vector<std::string> present = ListSockets(plugins_registry_dir());
  std::vector<std::string> to_register;
  std::vector<std::unique_ptr<HealthWatch>> health_stops;  // joined outside mu_
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    // Sockets that went away, or were replaced: deregister.
    for (auto it = watched_.begin(); it != watched_.end();) {
      const std::string& path = it->first;
      const bool listed = std::find(present.begin(), present.end(), path) != present.end();
      bool still = listed && InodeKey(path) == it->second.inode_key;
      // Gone without a deletion (renamed away, or its event not read yet):
      // nothing the kubelet acts on.
      if (!listed && deleted_.count(path) == 0) still = true;
      deleted_.erase(path);
      if (still) {
        ++it;
        continue;
      }
      if (it->second.registered && dra_drivers_.count(it->second.resource) > 0) {
        DeregisterDraSocketLocked(path, it->second.resource, &health_stops);
      } else if (it->second.registered) {
        // Deregistration. The plugin's stream may already have ended (then
        // its devices are unhealthy already); the watcher reports it anyway.
        events_.Emit("plugin_deregistered",
                     {{"resource", it->second.resource}, {"socket", path}});
        if (kubelet_.TracksClientsPerSocket()) {
          // DeRegisterPlugin: the client of that registration, by socket.
          auto clients = socket_clients_.find(it->second.resource);
          std::shared_ptr<PluginClient> client;
          if (clients != socket_clients_.end()) {
            for (const auto& [socket, c] : clients->second) {
              if (c->watch_socket == path) client = c;
            }
          }
          if (client != nullptr) {
            clients->second.erase(client->socket_path);
            if (clients->second.empty()) socket_clients_.erase(clients);
            client->Cancel();
            DisconnectSocketLocked(client->resource, client->socket_path,
                                   "its registration socket was removed");
          }
          it = watched_.erase(it);
          continue;
        }
        auto c = clients_.find(it->second.resource);
        if (c != clients_.end() && c->second->watch_socket == path) {
          std::shared_ptr<PluginClient> client = c->second;
          clients_.erase(c);
          StopEndpoint(client);
          client->Cancel();
          if (state_.EndpointLost(client->resource, client->generation, absl::Now())) {
            for (const std::string& r : state_.ExpireResources(absl::Now(), Grace())) {
              events_.Emit("resource_removed", {{"resource", r}, {"reason", "plugin lost"}});
            }
            WriteCheckpointLocked();
          }
        }
      }
      it = watched_.erase(it);
    }
    for (const std::string& path : present) {
      if (watched_.count(path) == 0) to_register.push_back(path);
    }
  }
  for (auto& w : health_stops) StopHealthWatch(std::move(w));
  for (const std::string& path : to_register) RegisterWatcherPlugin(path);
}

void KubeletSim::RegisterWatcherPlugin(const std::string& socket_path) {
  const std::string inode = InodeKey(socket_path);
  events_.Emit("watcher_found", {{"socket", socket_path}});
  auto channel = MakeUnixChannel(socket_path);
  auto stopping = [this] {
    absl::MutexLock lock(&mu_);
    return !running_;
  };
  auto remember = [&](const std::string& resource, bool registered) {
    absl::MutexLock lock(&mu_);
    watched_[socket_path] = WatchedSocket{inode, resource, registered};
  };
  auto stub = pluginregistration::Registration::NewStub(channel);
  auto notify = [&](bool ok, const std::string& error) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    pluginregistration::RegistrationStatus st;
    st.set_plugin_registered(ok);
    st.set_error(error);
    pluginregistration::RegistrationStatusResponse resp;
    stub->NotifyRegistrationStatus(&ctx, st, &resp);
  };
  if (absl::Status s = Dial(channel.get(), options_.dial_timeout, stopping); !s.ok()) {
    events_.Emit("watcher_registration_failed",
                 {{"socket", socket_path},
                  {"error", absl::StrCat("failed to dial socket ", socket_path, ", err: ",
                                         s.message())}});
    remember("", false);
    return;
  }
  pluginregistration::PluginInfo info;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    grpc::Status st = stub->GetInfo(&ctx, pluginregistration::InfoRequest(), &info);
    if (!st.ok()) {
      events_.Emit("watcher_registration_failed",
                   {{"socket", socket_path},
                    {"error", absl::StrCat("failed to get plugin info using RPC GetInfo at "
                                           "socket ", socket_path, ", err: ", GoRpcError(st))}});
      remember("", false);
      return;
    }
  }
  std::string error;
  const std::string endpoint_of_info = info.endpoint().empty() ? socket_path : info.endpoint();
  int minor = 0;
  {
    absl::MutexLock lock(&mu_);
    minor = kubelet_.minor;
  }
  if (info.type() == "DRAPlugin" && minor >= 32) {
    error = RegisterDraDriver(info, endpoint_of_info, socket_path);
    remember(info.name(), error.empty());
    notify(error.empty(), error);
    if (!error.empty()) {
      events_.Emit("registration_rejected", {{"driver", info.name()},
                                             {"socket", socket_path},
                                             {"via", "plugin-watcher"},
                                             {"error", error}});
    }
    return;
  }
  if (info.type() != kDevicePluginType) {
    error = absl::StrCat("no handler registered for plugin type: ", info.type(),
                         " at socket ", socket_path);
  } else {
    std::vector<std::string> versions(info.supported_versions().begin(),
                                      info.supported_versions().end());
    absl::Status s = CheckWatcherVersions(versions);
    if (s.ok()) s = CheckResourceName(info.name());
    if (!s.ok()) error = std::string(s.message());
  }
  const std::string endpoint = info.endpoint().empty() ? socket_path : info.endpoint();
  if (error.empty()) {
    absl::StatusOr<std::shared_ptr<PluginClient>> c =
        ConnectSync(info.name(), endpoint, "plugin-watcher", socket_path);
    if (!c.ok()) error = std::string(c.status().message());
  }
  if (!error.empty()) {
    events_.Emit("registration_rejected", {{"resource", info.name()},
                                           {"socket", socket_path},
                                           {"via", "plugin-watcher"},
                                           {"error", error}});
    notify(false, error);
    remember(info.name(), false);
    return;
  }
  remember(info.name(), true);
  notify(true, "");
  events_.Emit("registered", {{"resource", info.name()},
                              {"endpoint", endpoint},
                              {"api_version", std::string(kV1Beta1Version)},
                              {"via", "plugin-watcher"},
                              {"mode", "sync"}});
}

// --- Admission -------------------------------------------------------------------

absl::StatusOr<AllocateResponse> KubeletSim::Allocate(const AllocateRequest& request) {
  if (request.containers().empty()) {
    return absl::InvalidArgumentError("pod has no containers");
  }
  std::set<std::string> names;
  for (const ContainerRequest& c : request.containers()) {
    if (c.name().empty()) return absl::InvalidArgumentError("a container has no name");
    if (!names.insert(c.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("container name ", GoQuote(c.name()), " is used twice"));
    }
    if (c.resource().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("container ", GoQuote(c.name()), " names no resource"));
    }
    if (c.count() < 0 || (c.count() == 0 && c.device_ids().empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "container ", GoQuote(c.name()), " must request at least one device"));
    }
    if (!c.device_ids().empty() && c.count() != 0 && c.count() != c.device_ids_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "container ", GoQuote(c.name()), " asks for ", c.count(), " devices but names ",
          c.device_ids_size()));
    }
  }
  AllocateRequest req = request;
  if (req.pod_uid().empty()) req.set_pod_uid(NewPodUid());
  if (req.pod_namespace().empty()) req.set_pod_namespace("default");
  if (req.pod_name().empty()) req.set_pod_name(absl::StrCat("pod-", req.pod_uid().substr(0, 8)));
  // The containers' requests an extended-resource claim serves leave the
  // device manager's part of the pod.
  AllocateRequest device_manager_part = req;
  if (req.has_extended_resource_claim()) {
    const ExtendedResourceClaim& e = req.extended_resource_claim();
    // DRAExtendedResource: alpha and off by default in 1.34-1.35, beta and
    // on from 1.36 (dra-facts.md); the simulator plays the defaults.
    if (kubelet().minor < 36) {
      return absl::FailedPreconditionError(absl::StrCat(
          "extended resources served through DRA need kubelet 1.36 or later, where "
          "DRAExtendedResource is on by default (1.34-1.35: alpha, off); this kubelet is ",
          kubelet().name));
    }
    if (e.name().empty() || e.uid().empty() || e.driver().empty() ||
        e.request_mappings().empty()) {
      return absl::InvalidArgumentError(
          "extended_resource_claim needs the claim's name, uid and driver and at least one "
          "request mapping");
    }
    std::set<std::pair<std::string, std::string>> mapped;
    for (const auto& m : e.request_mappings()) {
      bool found = false;
      for (const ContainerRequest& c : req.containers()) {
        if (c.name() == m.container() && c.resource() == m.resource()) found = true;
      }
      if (!found || m.request().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "extended_resource_claim maps container ", GoQuote(m.container()), " resource ",
            m.resource(), found ? " to no request" : ", which the pod does not ask for"));
      }
      mapped.insert({m.container(), m.resource()});
    }
    device_manager_part.clear_containers();
    for (const ContainerRequest& c : req.containers()) {
      if (mapped.count({c.name(), c.resource()}) == 0) *device_manager_part.add_containers() = c;
    }
  }

  absl::MutexLock admit(&admit_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("kubelet is not running");
    if (state_.HasPod(req.pod_uid())) {
      return absl::AlreadyExistsError(absl::StrCat("pod ", req.pod_uid(), " already exists"));
    }
  }
  AllocateResponse response;
  response.set_pod_uid(req.pod_uid());
  std::vector<RuntimeDevices> claim_served;
  if (req.has_extended_resource_claim()) {
    absl::StatusOr<std::vector<RuntimeDevices>> served = PrepareExtendedResourceClaim(req);
    if (!served.ok()) return served.status();
    claim_served = *std::move(served);
    // Starting the containers: the device manager's run options
    // (GetDeviceRunContainerOptions) take every resource of the container
    // that any pod holds devices of as a device-plugin resource, whether a
    // claim serves this one or not, and look up its endpoint. One the
    // kubelet dropped (endpointStopGracePeriod after it stopped) fails the
    // start (observed on a 1.36.2 node).
    std::string missing;
    {
      absl::MutexLock lock(&mu_);
      for (const RuntimeDevices& r : claim_served) {
        if (state_.Find(r.resource()) != nullptr) continue;
        for (const ContainerAllocation& a : state_.allocations()) {
          const PodState* p = state_.FindPod(a.pod_uid());
          if (a.resource() == r.resource() && p != nullptr && p->phase() == "Running") {
            missing = r.resource();
          }
        }
      }
    }
    if (!missing.empty()) {
      const ExtendedResourceClaim& e = req.extended_resource_claim();
      (void)UnprepareClaims(e.driver(), {{e.namespace_(), e.name(), e.uid()}});
      const std::string message =
          absl::StrCat("endpoint not found in cache for a registered resource: ", missing);
      events_.Emit("container_start_failed", {{"pod", req.pod_name()},
                                              {"pod_uid", req.pod_uid()},
                                              {"reason", "CreateContainerConfigError"},
                                              {"message", message}});
      return absl::FailedPreconditionError(absl::StrCat("CreateContainerConfigError: ", message));
    }
  }
  absl::Status s = absl::OkStatus();
  if (!device_manager_part.containers().empty()) {
    s = AdmitPod(device_manager_part, &response);
    if (!s.ok() && req.has_extended_resource_claim()) {
      // Admission failed: the pod never starts, its claim is released.
      const ExtendedResourceClaim& e = req.extended_resource_claim();
      (void)UnprepareClaims(e.driver(), {{e.namespace_(), e.name(), e.uid()}});
    }
  } else {
    PodState pod;
    pod.set_uid(req.pod_uid());
    pod.set_name(req.pod_name());
    pod.set_namespace_(req.pod_namespace());
    pod.set_phase("Running");
    absl::MutexLock lock(&mu_);
    state_.AddPod(pod);
    (void)MakeDirs(JoinPath(JoinPath(options_.root_dir, "pods"), req.pod_uid()));
  }
  if (s.ok() && req.has_extended_resource_claim()) {
    absl::MutexLock lock(&mu_);
    state_.SetExtendedResourceClaim(req.pod_uid(), req.extended_resource_claim());
    for (const RuntimeDevices& r : claim_served) {
      state_.AddRunning(req.pod_uid(), r);
      *response.add_claim_served() = r;
    }
    WriteCheckpointLocked();
  }
  if (!s.ok()) {
    std::string message = absl::StrCat("Allocate failed due to ", s.message(),
                                       ", which is unexpected");
    if (s.code() == absl::StatusCode::kAborted) message = std::string(s.message());
    PodState pod;
    pod.set_uid(req.pod_uid());
    pod.set_name(req.pod_name());
    pod.set_namespace_(req.pod_namespace());
    pod.set_phase("Failed");
    pod.set_reason(s.code() == absl::StatusCode::kAborted ? "RunContainerError"
                                                          : "UnexpectedAdmissionError");
    pod.set_message(message);
    {
      absl::MutexLock lock(&mu_);
      state_.AddPod(pod);
      state_.FailPod(pod.uid(), pod.reason(), pod.message());
      WriteCheckpointLocked();
    }
    events_.Emit("admission_failed", {{"pod", req.pod_name()},
                                      {"pod_uid", req.pod_uid()},
                                      {"reason", pod.reason()},
                                      {"message", message}});
    return absl::FailedPreconditionError(message);
  }
  return response;
}

absl::StatusOr<std::vector<std::string>> KubeletSim::PickDevices(
    const ContainerRequest& c, const std::set<std::string>& taken,
    const std::vector<std::string>& reusable) {
  const int count = c.count() != 0 ? c.count() : c.device_ids_size();
  if (c.device_ids().empty() && static_cast<int>(reusable.size()) >= count) {
    // An init container's devices suffice: reused as they are.
    return std::vector<std::string>(reusable.begin(), reusable.begin() + count);
  }
  std::vector<std::string> available = reusable;
  std::shared_ptr<PluginClient> client;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::vector<std::string>> avail = state_.AvailableFor(c.resource(), 0);
    if (!avail.ok()) return avail.status();
    for (const std::string& id : *avail) {
      if (taken.count(id) == 0 &&
          std::find(reusable.begin(), reusable.end(), id) == reusable.end()) {
        available.push_back(id);
      }
    }
    auto it = endpoints_.find(c.resource());
    if (it != endpoints_.end()) client = it->second;
  }
  if (static_cast<int>(available.size()) < count) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "requested number of devices unavailable for ", c.resource(),
        ". Requested: ", count, ", Available: ", available.size()));
  }
  if (client == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("endpoint for ", c.resource(), " has been stopped"));
  }
  std::vector<std::string> chosen;
  if (!c.device_ids().empty()) {
    for (const std::string& id : c.device_ids()) {
      if (std::find(available.begin(), available.end(), id) == available.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "device ", GoQuote(id), " of ", c.resource(),
            " is not available (unknown, unhealthy or allocated)"));
      }
      chosen.push_back(id);
    }
  } else if (client->beta && client->options.get_preferred_allocation_available()) {
    // The plugin's answer is advice: what it names of the available
    // devices is used as given, and a short answer is topped up from the
    // available devices in order.
    v1beta1::PreferredAllocationRequest preq;
    auto* cr = preq.add_container_requests();
    for (const std::string& id : available) cr->add_available_deviceids(id);
    for (const std::string& id : reusable) cr->add_must_include_deviceids(id);
    cr->set_allocation_size(count);
    v1beta1::PreferredAllocationResponse presp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kAdmissionRpcTimeout));
    grpc::Status st = client->beta->GetPreferredAllocation(&ctx, preq, &presp);
    if (!st.ok()) {
      return absl::UnknownError(absl::StrCat(
          "device plugin GetPreferredAllocation rpc failed with err: ", GoRpcError(st)));
    }
    std::vector<std::string> preferred, returned;
    for (const auto& r : presp.container_responses()) {
      returned.insert(returned.end(), r.deviceids().begin(), r.deviceids().end());
    }
    if (presp.container_responses_size() > 0) {
      for (const std::string& id : presp.container_responses(0).deviceids()) {
        if (std::find(available.begin(), available.end(), id) != available.end() &&
            std::find(preferred.begin(), preferred.end(), id) == preferred.end()) {
          preferred.push_back(id);
        }
      }
    }
    events_.Emit("preferred_allocation", {{"resource", c.resource()},
                                          {"container", c.name()},
                                          {"available", available},
                                          {"size", count},
                                          {"returned", returned},
                                          {"container_responses",
                                           presp.container_responses_size()},
                                          {"preferred", preferred}});
    chosen = reusable;  // must_include is kept whatever the plugin answers
    for (const std::string& id : preferred) {
      if (static_cast<int>(chosen.size()) >= count) break;
      if (std::find(chosen.begin(), chosen.end(), id) == chosen.end()) chosen.push_back(id);
    }
    for (const std::string& id : available) {
      if (static_cast<int>(chosen.size()) >= count) break;
      if (std::find(chosen.begin(), chosen.end(), id) == chosen.end()) chosen.push_back(id);
    }
    chosen.resize(count);
  } else {
    chosen.assign(available.begin(), available.begin() + count);
  }
  return chosen;
}

absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>> KubeletSim::CallAllocate(
    const std::string& resource, const std::vector<std::vector<std::string>>& ids,
    std::shared_ptr<PluginClient>* used) {
  std::shared_ptr<PluginClient> client;
  {
    absl::MutexLock lock(&mu_);
    auto it = endpoints_.find(resource);
    if (it != endpoints_.end()) client = it->second;
  }
  if (client == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("endpoint for ", resource, " has been stopped"));
  }
  if (used != nullptr) *used = client;
  std::vector<v1beta1::ContainerAllocateResponse> responses(ids.size());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kAdmissionRpcTimeout));
  if (client->beta) {
    v1beta1::AllocateRequest areq;
    for (const std::vector<std::string>& container : ids) {
      auto* cr = areq.add_container_requests();
      for (const std::string& id : container) cr->add_devices_ids(id);
    }
    v1beta1::AllocateResponse aresp;
    grpc::Status st = client->beta->Allocate(&ctx, areq, &aresp);
    if (!st.ok()) return absl::UnknownError(GoRpcError(st));
    if (aresp.container_responses_size() == 0) {
      return absl::UnknownError("no containers return in allocation response");
    }
    if (aresp.container_responses_size() < static_cast<int>(ids.size())) {
      return absl::UnknownError(absl::StrCat(
          "allocation response has ", aresp.container_responses_size(),
          " container responses for ", ids.size(), " container requests"));
    }
    for (size_t k = 0; k < ids.size(); ++k) responses[k] = aresp.container_responses(k);
    return responses;
  }
  if (ids.size() != 1) {
    return absl::InvalidArgumentError("v1alpha plugins take one container per Allocate");
  }
  deviceplugin::AllocateRequest areq;
  for (const std::string& id : ids[0]) areq.add_devicesids(id);
  deviceplugin::AllocateResponse aresp;
  grpc::Status st = client->alpha->Allocate(&ctx, areq, &aresp);
  if (!st.ok()) return absl::UnknownError(GoRpcError(st));
  // A 1.9 kubelet stored the v1alpha response as it came; it parses as a
  // v1beta1 ContainerAllocateResponse (same field numbers). Annotations
  // were never read by a 1.9 kubelet.
  aresp.clear_annotations();
  std::string bytes;
  aresp.SerializeToString(&bytes);
  responses[0].ParseFromString(bytes);
  return responses;
}

absl::Status KubeletSim::AdmitPod(const AllocateRequest& req, AllocateResponse* response) {
  const KubeletVersion kubelet = this->kubelet();
  struct Planned {
    const ContainerRequest* request;
    std::vector<std::string> ids;
  };
  std::vector<Planned> planned;
  std::map<std::string, std::set<std::string>> taken;  // by this pod so far

  // 1. Pick devices per container, asking the plugin for its preference:
  // init containers first, whose devices the app containers reuse.
  std::vector<const ContainerRequest*> order;
  for (const ContainerRequest& c : req.containers()) {
    if (c.init()) order.push_back(&c);
  }
  for (const ContainerRequest& c : req.containers()) {
    if (!c.init()) order.push_back(&c);
  }
  std::map<std::string, std::vector<std::string>> reusable;  // init containers' devices
  for (const ContainerRequest* c : order) {
    std::vector<std::string>& reuse = reusable[c->resource()];
    absl::StatusOr<std::vector<std::string>> chosen =
        PickDevices(*c, taken[c->resource()], reuse);
    if (!chosen.ok()) return chosen.status();
    if (c->init()) {
      for (const std::string& id : *chosen) {
        if (std::find(reuse.begin(), reuse.end(), id) == reuse.end()) reuse.push_back(id);
      }
    } else {
      taken[c->resource()].insert(chosen->begin(), chosen->end());
      for (const std::string& id : *chosen) {
        reuse.erase(std::remove(reuse.begin(), reuse.end(), id), reuse.end());
      }
    }
    planned.push_back({c, *std::move(chosen)});
  }

  // 2. Allocate: one call per container as the kubelet does, or one call
  // per resource with every container request when batching.
  std::vector<v1beta1::ContainerAllocateResponse> responses(planned.size());
  std::vector<std::vector<size_t>> calls;
  if (req.batch()) {
    std::map<std::string, size_t> call_of;
    for (size_t i = 0; i < planned.size(); ++i) {
      auto [it, inserted] = call_of.emplace(planned[i].request->resource(), calls.size());
      if (inserted) calls.emplace_back();
      calls[it->second].push_back(i);
    }
  } else {
    for (size_t i = 0; i < planned.size(); ++i) calls.push_back({i});
  }
  std::map<std::string, std::shared_ptr<PluginClient>> used;
  for (const std::vector<size_t>& call : calls) {
    const std::string& resource = planned[call[0]].request->resource();
    std::vector<std::vector<std::string>> ids;
    for (size_t i : call) ids.push_back(planned[i].ids);
    absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>> r =
        CallAllocate(resource, ids, &used[resource]);
    if (!r.ok()) return r.status();
    for (size_t k = 0; k < call.size(); ++k) responses[call[k]] = (*r)[k];
  }
  // What this release's ContainerAllocateResponse does not have, it never
  // read: cdi_devices before 1.28 (and in 1.28-1.30 with the gate off).
  std::vector<std::vector<std::string>> unread(responses.size());
  if (!kubelet.ReadsCdiDevices()) {
    for (size_t i = 0; i < responses.size(); ++i) {
      if (responses[i].cdi_devices_size() > 0) unread[i].push_back("cdi_devices");
      responses[i].clear_cdi_devices();
    }
  }

  // 3. Record (checkpoint) the admitted pod.
  std::vector<ContainerAllocation> allocations;
  {
    absl::MutexLock lock(&mu_);
    PodState pod;
    pod.set_uid(req.pod_uid());
    pod.set_name(req.pod_name());
    pod.set_namespace_(req.pod_namespace());
    pod.set_phase("Running");
    for (const Planned& p : planned) {
      ContainerRequest* spec = pod.add_containers();
      spec->set_name(p.request->name());
      spec->set_resource(p.request->resource());
      spec->set_count(static_cast<int32_t>(p.ids.size()));
      spec->set_init(p.request->init());
      spec->set_never_starts(p.request->never_starts());
      if (p.request->init()) continue;  // ran to completion
      if (p.request->never_starts()) continue;  // its creation fails
      // The container runtime starts it with these devices.
      RuntimeDevices* run = pod.add_running();
      run->set_container(p.request->name());
      run->set_resource(p.request->resource());
      for (const std::string& id : p.ids) run->add_device_ids(id);
    }
    state_.AddPod(pod);
    (void)MakeDirs(JoinPath(JoinPath(options_.root_dir, "pods"), req.pod_uid()));
    for (size_t i = 0; i < planned.size(); ++i) {
      const ContainerAllocation a = MakeAllocation(
          req.pod_uid(), req.pod_name(), req.pod_namespace(), planned[i].request->name(),
          planned[i].request->resource(), planned[i].ids, responses[i]);
      state_.AddAllocation(a);
      allocations.push_back(a);
    }
    WriteCheckpointLocked();
  }
  for (size_t i = 0; i < allocations.size(); ++i) {
    const ContainerAllocation& a = allocations[i];
    Json envs = Json::object();
    for (const auto& [k, v] : a.response().envs()) envs[k] = v;
    Json cdi = Json::array();
    for (const auto& d : a.response().cdi_devices()) cdi.push_back(d.name());
    events_.Emit("allocated", {{"pod", a.pod_name()},
                               {"pod_uid", a.pod_uid()},
                               {"container", a.container()},
                               {"resource", a.resource()},
                               {"devices", std::vector<std::string>(a.device_ids().begin(),
                                                                    a.device_ids().end())},
                               {"envs", envs},
                               {"mounts", a.response().mounts_size()},
                               {"device_specs", a.response().devices_size()},
                               {"annotations", a.response().annotations_size()},
                               {"cdi_devices", cdi},
                               {"unread", unread[i]}});
  }

  // 4. Start the containers: PreStartContainer when the plugin requires it.
  for (ContainerAllocation& a : allocations) {
    std::shared_ptr<PluginClient> client = used[a.resource()];
    if (!client->beta || !client->options.pre_start_required()) {
      *response->add_allocations() = a;
      continue;
    }
    v1beta1::PreStartContainerRequest preq;
    for (const std::string& id : a.device_ids()) preq.add_devices_ids(id);
    v1beta1::PreStartContainerResponse presp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kPreStartTimeout));
    grpc::Status st = client->beta->PreStartContainer(&ctx, preq, &presp);
    if (!st.ok()) {
      return absl::AbortedError(absl::StrCat(
          "device plugin PreStartContainer rpc failed with err: ", GoRpcError(st)));
    }
    a.set_pre_started(true);
    events_.Emit("pre_start", {{"pod", a.pod_name()},
                               {"container", a.container()},
                               {"resource", a.resource()},
                               {"devices", std::vector<std::string>(a.device_ids().begin(),
                                                                    a.device_ids().end())}});
    *response->add_allocations() = a;
  }
  return absl::OkStatus();
}

void KubeletSim::UpdateNodeStatus() {
  std::map<std::string, int64_t> status;
  {
    absl::MutexLock lock(&mu_);
    if (!running_ || absl::Now() < status_due_) return;
    status_due_ = absl::Now() + options_.node_status_period;
    status = state_.AllAllocatable();
    if (status != status_allocatable_) {
      nlohmann::json shown = nlohmann::json::object();
      for (const auto& [name, n] : status) shown[name] = n;
      events_.Emit("node_status_updated", {{"allocatable", shown}});
    }
    status_allocatable_ = status;
  }
  if (options_.on_node_status) options_.on_node_status(status);
}

State KubeletSim::GetState() {
  State st;
  absl::MutexLock lock(&mu_);
  st.set_personality(PersonalityName(kubelet_.personality));
  st.set_kubelet(kubelet_.name);
  st.set_generation(kubelet_.GenerationName());
  st.set_starts(starts_);
  st.set_root_dir(options_.root_dir);
  st.set_pods_synced(pods_synced_);
  state_.FillState(absl::Now(), &st);
  for (ResourceState& r : *st.mutable_resources()) {
    if (options_.node_status_period <= absl::ZeroDuration()) {
      r.set_status_allocatable(r.allocatable());
    } else {
      auto it = status_allocatable_.find(r.name());
      r.set_status_allocatable(it == status_allocatable_.end() ? 0 : it->second);
    }
  }
  return st;
}

ReadmitResponse KubeletSim::Readmit() {
  ReadmitResponse resp;
  absl::MutexLock admit(&admit_mu_);
  absl::MutexLock lock(&mu_);
  for (ReadmitResult& r : state_.Readmit()) {
    events_.Emit(r.admitted() ? "readmitted" : "readmission_failed",
                 {{"pod", r.pod_name()},
                  {"pod_uid", r.pod_uid()},
                  {"container", r.container()},
                  {"resource", r.resource()},
                  {"reason", r.reason()},
                  {"message", r.message()}});
    *resp.add_results() = std::move(r);
  }
  WriteCheckpointLocked();
  return resp;
}

absl::StatusOr<std::vector<RuntimeDevices>> KubeletSim::PrepareExtendedResourceClaim(
    const AllocateRequest& req) {
  const ExtendedResourceClaim& e = req.extended_resource_claim();
  const std::string claim = absl::StrCat(e.namespace_(), "/", e.name());
  absl::StatusOr<nlohmann::json> r = PrepareClaims(e.driver(), {{e.namespace_(), e.name(), e.uid()}});
  std::string error;
  if (!r.ok()) {
    error = std::string(r.status().message());
  } else if (!r->contains(e.uid())) {
    error = "the driver's answer does not name the claim";
  } else {
    error = (*r)[e.uid()].value("error", "");
  }
  if (!error.empty()) {
    events_.Emit("pod_waits_for_claim",
                 {{"pod", req.pod_name()}, {"claim", claim}, {"error", error}});
    return absl::UnavailableError(absl::StrCat("pod ", req.pod_name(), " waits: preparing claim ",
                                               claim, " failed: ", error));
  }
  // Each mapped container gets the devices of its request.
  std::vector<RuntimeDevices> out;
  for (const auto& m : e.request_mappings()) {
    RuntimeDevices run;
    run.set_container(m.container());
    run.set_resource(m.resource());
    for (const nlohmann::json& d : (*r)[e.uid()].value("devices", nlohmann::json::array())) {
      const std::vector<std::string> requests =
          d.value("request_names", std::vector<std::string>());
      if (std::find(requests.begin(), requests.end(), m.request()) == requests.end()) continue;
      run.add_claim_devices(d.value("device", ""));
      run.add_claim_pools(d.value("pool", ""));
      run.set_claim_driver(e.driver());
      for (const std::string& id : d.value("cdi_device_ids", std::vector<std::string>())) {
        run.add_cdi_device_ids(id);
      }
    }
    events_.Emit("allocated_from_claim",
                 {{"pod", req.pod_name()},
                  {"container", m.container()},
                  {"resource", m.resource()},
                  {"claim", claim},
                  {"devices", std::vector<std::string>(run.claim_devices().begin(),
                                                       run.claim_devices().end())},
                  {"cdi_devices", std::vector<std::string>(run.cdi_device_ids().begin(),
                                                           run.cdi_device_ids().end())}});
    out.push_back(std::move(run));
  }
  return out;
}

absl::Status KubeletSim::DeletePod(const std::string& uid) {
  absl::MutexLock admit(&admit_mu_);
  std::optional<ExtendedResourceClaim> claim;
  {
    absl::MutexLock lock(&mu_);
    const PodState* p = state_.FindPod(uid);
    if (p != nullptr && p->has_extended_resource_claim() && p->phase() == "Running") {
      claim = p->extended_resource_claim();
    }
  }
  if (claim.has_value()) {
    // The pod's containers are gone: the kubelet unprepares its claim, and
    // keeps the pod until that succeeds.
    absl::StatusOr<nlohmann::json> r =
        UnprepareClaims(claim->driver(), {{claim->namespace_(), claim->name(), claim->uid()}});
    std::string error = r.ok() ? (*r).value(claim->uid(), nlohmann::json::object())
                                     .value("error", "")
                               : std::string(r.status().message());
    if (!error.empty()) {
      return absl::UnavailableError(absl::StrCat("pod ", uid, " stays: unpreparing claim ",
                                                 claim->namespace_(), "/", claim->name(),
                                                 " failed: ", error));
    }
  }
  absl::MutexLock lock(&mu_);
  DPP_RETURN_IF_ERROR(state_.DeletePod(uid));
  events_.Emit("pod_deleted", {{"pod_uid", uid}});
  pod_dirs_gone_at_[uid] = absl::Now() + options_.pod_dir_linger;
  WriteCheckpointLocked();
  return absl::OkStatus();
}

absl::StatusOr<RestartContainerResponse> KubeletSim::RestartContainer(
    const std::string& uid, const std::string& container) {
  absl::MutexLock admit(&admit_mu_);
  std::vector<ContainerRequest> specs;
  std::string pod_name, pod_namespace;
  std::map<std::string, ContainerAllocation> recorded;  // by resource
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("kubelet is not running");
    auto pod = state_.pods().find(uid);
    if (pod == state_.pods().end() || pod->second.phase() != "Running") {
      return absl::NotFoundError(absl::StrCat("no running pod with uid ", GoQuote(uid)));
    }
    pod_name = pod->second.name();
    pod_namespace = pod->second.namespace_();
    for (const ContainerRequest& c : pod->second.containers()) {
      if (!c.init() && c.name() == container) specs.push_back(c);
    }
    for (const ContainerAllocation& a : state_.allocations()) {
      if (a.pod_uid() == uid && a.container() == container) recorded[a.resource()] = a;
    }
    state_.StopContainer(uid, container);
  }
  if (specs.empty()) {
    return absl::NotFoundError(absl::StrCat("pod ", GoQuote(uid), " has no container ",
                                            GoQuote(container)));
  }
  RestartContainerResponse resp;
  for (const ContainerRequest& c : specs) {
    RuntimeDevices run;
    run.set_container(container);
    run.set_resource(c.resource());
    auto rec = recorded.find(c.resource());
    if (rec != recorded.end()) {
      run.mutable_device_ids()->CopyFrom(rec->second.device_ids());
    } else {
      // The kubelet holds no devices for it (it lost its checkpoint).
      events_.Emit("reallocating", {{"pod", pod_name},
                                    {"pod_uid", uid},
                                    {"container", container},
                                    {"resource", c.resource()},
                                    {"note", "Needs to re-allocate device plugin resources for pod"}});
      absl::StatusOr<std::vector<std::string>> ids = PickDevices(c, {});
      absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>> r =
          ids.ok() ? CallAllocate(c.resource(), {*ids}, nullptr)
                   : absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>>(ids.status());
      if (!r.ok()) {
        const std::string message = std::string(r.status().message());
        events_.Emit("container_start_failed", {{"pod", pod_name},
                                                {"pod_uid", uid},
                                                {"container", container},
                                                {"reason", "CreateContainerConfigError"},
                                                {"message", message}});
        return absl::FailedPreconditionError(message);
      }
      const ContainerAllocation a = MakeAllocation(uid, pod_name, pod_namespace, container,
                                                   c.resource(), *ids, (*r)[0]);
      {
        absl::MutexLock lock(&mu_);
        state_.AddAllocation(a);
        WriteCheckpointLocked();
      }
      run.mutable_device_ids()->CopyFrom(a.device_ids());
      resp.set_reallocated(true);
    }
    *resp.add_running() = run;
  }
  {
    absl::MutexLock lock(&mu_);
    for (const RuntimeDevices& run : resp.running()) state_.AddRunning(uid, run);
    WriteCheckpointLocked();
  }
  events_.Emit("container_restarted", {{"pod", pod_name},
                                       {"pod_uid", uid},
                                       {"container", container},
                                       {"reallocated", resp.reallocated()}});
  return resp;
}

bool KubeletSim::WaitForPodsSynced(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto synced = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> bool {
    return running_ && pods_synced_;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&synced), timeout);
}

std::set<std::string> KubeletSim::UnsyncedPods() {
  absl::MutexLock lock(&mu_);
  return unsynced_pods_;
}

bool KubeletSim::WaitForResource(const std::string& resource, int min_healthy,
                                 absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> bool {
    const ResourceRecord* r = state_.Find(resource);
    return r != nullptr && r->connected && state_.Allocatable(resource) >= min_healthy;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
}

// --- DRA ---------------------------------------------------------------------------

namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

void KubeletSim::DeregisterDraSocketLocked(const std::string& path, const std::string& driver,
                                           std::vector<std::unique_ptr<HealthWatch>>* stops) {
  auto current = dra_drivers_.find(driver);
  std::vector<DraDriver>& older = dra_older_[driver];
  if (kubelet_.minor >= 33 && current->second.registration != path) {
    // An instance registered before the current one: forgotten.
    older.erase(std::remove_if(older.begin(), older.end(),
                               [&path](const DraDriver& d) { return d.registration == path; }),
                older.end());
    events_.Emit("dra_instance_removed", {{"driver", driver}, {"socket", path}});
    return;
  }
  auto stop_health = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto h = health_watches_.find(driver);
    if (h != health_watches_.end()) {
      stops->push_back(std::move(h->second));
      health_watches_.erase(h);
    }
    dra_health_.erase(driver);
  };
  if (kubelet_.minor >= 33 && !older.empty()) {
    // The current instance went: the one registered before it serves.
    current->second = older.back();
    older.pop_back();
    events_.Emit("dra_driver_fallback", {{"driver", driver},
                                         {"socket", path},
                                         {"endpoint", current->second.endpoint}});
    stop_health();
    stops->push_back(StartHealthWatchLocked(driver, current->second.endpoint,
                                            current->second.health));
    return;
  }
  // The last instance, or (up to 1.32) any socket of the driver: by name.
  dra_drivers_.erase(current);
  dra_older_.erase(driver);
  events_.Emit("dra_driver_deregistered", {{"driver", driver}, {"socket", path}});
  stop_health();
}

std::unique_ptr<KubeletSim::HealthWatch> KubeletSim::StartHealthWatchLocked(
    const std::string& driver, const std::string& endpoint, const std::string& service) {
  std::unique_ptr<HealthWatch> replaced;
  if (auto it = health_watches_.find(driver); it != health_watches_.end()) {
    replaced = std::move(it->second);
    health_watches_.erase(it);
  }
  dra_health_.erase(driver);
  if (service.empty()) return replaced;
  std::unique_ptr<HealthWatch>& w = health_watches_[driver];
  w = std::make_unique<HealthWatch>();
  HealthWatch* raw = w.get();
  raw->thread = std::thread(
      [this, raw, driver, endpoint, service] { WatchDraHealth(driver, endpoint, service, raw); });
  return replaced;
}

std::string KubeletSim::RegisterDraDriver(const pluginregistration::PluginInfo& info,
                                          const std::string& endpoint,
                                          const std::string& socket_path) {
  KubeletVersion kubelet;
  {
    absl::MutexLock lock(&mu_);
    kubelet = kubelet_;
  }
  // The first service in the plugin's order that this release knows.
  std::vector<std::string> known = {"v1beta1.DRAPlugin"};
  if (kubelet.minor >= 34) known.insert(known.begin(), "v1.DRAPlugin");
  std::string chosen;
  for (const std::string& v : info.supported_versions()) {
    if (std::find(known.begin(), known.end(), v) != known.end()) {
      chosen = v;
      break;
    }
  }
  if (chosen.empty()) {
    return absl::StrCat("none of the versions supported by DRA plugin ", info.name(), " (",
                        absl::StrJoin(info.supported_versions(), ", "),
                        ") is supported by kubelet ", kubelet.name, " (",
                        absl::StrJoin(known, ", "), ")");
  }
  std::unique_ptr<HealthWatch> replaced;
  {
    absl::MutexLock lock(&mu_);
    auto current = dra_drivers_.find(info.name());
    if (current != dra_drivers_.end() && current->second.registration != socket_path) {
      // Another instance of the driver: 1.33+ keep the one it replaces to
      // fall back to; earlier releases forget it.
      if (kubelet.minor >= 33) dra_older_[info.name()].push_back(current->second);
      events_.Emit("dra_driver_replaced", {{"driver", info.name()},
                                           {"old_endpoint", current->second.endpoint},
                                           {"endpoint", endpoint},
                                           {"kept", kubelet.minor >= 33}});
    }
    // 1.36 turns ResourceHealthStatus on: the kubelet watches every
    // driver's health (v1alpha1), whether it offers the service or not.
    // 1.37 only a driver that lists a health service, v1 first.
    std::string health;
    if (kubelet.minor == 36) health = "v1alpha1.DRAResourceHealth";
    if (kubelet.minor >= 37) {
      for (const char* h : {"v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"}) {
        if (health.empty() && std::find(info.supported_versions().begin(),
                                        info.supported_versions().end(),
                                        h) != info.supported_versions().end()) {
          health = h;
        }
      }
    }
    dra_drivers_[info.name()] = DraDriver{endpoint, chosen, socket_path, health};
    events_.Emit("dra_driver_registered", {{"driver", info.name()},
                                           {"endpoint", endpoint},
                                           {"service", chosen},
                                           {"health_service", health}});
    if (kubelet.minor >= 36) replaced = StartHealthWatchLocked(info.name(), endpoint, health);
  }
  StopHealthWatch(std::move(replaced));
  return "";
}

void KubeletSim::StopHealthWatch(std::unique_ptr<HealthWatch> w) {
  if (w == nullptr) return;
  {
    absl::MutexLock lock(&w->mu);
    w->stop = true;
    if (w->ctx != nullptr) w->ctx->TryCancel();
  }
  if (w->thread.joinable()) w->thread.join();
}

namespace {

// One NodeWatchResources stream of either package (`Generated`, the
// generated service; the same messages).
template <typename Generated>
grpc::Status ReadHealth(const std::string& endpoint, grpc::ClientContext* ctx,
                        const std::function<void(const ::v1alpha1::NodeWatchResourcesResponse&)>&
                            read) {
  auto stub = Generated::NewStub(MakeUnixChannel(endpoint));
  auto reader = stub->NodeWatchResources(ctx, ::v1alpha1::NodeWatchResourcesRequest());
  ::v1alpha1::NodeWatchResourcesResponse m;
  while (reader->Read(&m)) read(m);
  return reader->Finish();
}

}  // namespace

void KubeletSim::WatchDraHealth(const std::string& driver, const std::string& endpoint,
                                const std::string& service, HealthWatch* w) {
  namespace health = ::v1alpha1;
  for (;;) {
    grpc::ClientContext ctx;
    {
      absl::MutexLock lock(&w->mu);
      if (w->stop) return;
      w->ctx = &ctx;
    }
    auto read = [&](const health::NodeWatchResourcesResponse& m) {
      std::map<std::string, DraDeviceHealth> now;
      int unhealthy = 0, unknown = 0;
      for (const auto& d : m.devices()) {
        DraDeviceHealth h;
        h.health = health::HealthStatus_Name(d.health());
        h.message = d.message();
        h.last_updated_time = d.last_updated_time();
        unhealthy += d.health() == health::UNHEALTHY;
        unknown += d.health() == health::UNKNOWN;
        now[absl::StrCat(d.device().pool_name(), "/", d.device().device_name())] = std::move(h);
      }
      absl::MutexLock lock(&mu_);
      dra_health_[driver] = std::move(now);
      events_.Emit("dra_health", {{"driver", driver},
                                  {"service", service},
                                  {"devices", m.devices_size()},
                                  {"unhealthy", unhealthy},
                                  {"unknown", unknown}});
    };
    const grpc::Status st = service == "v1.DRAResourceHealth"
                                ? ReadHealth<::v1::DRAResourceHealth>(endpoint, &ctx, read)
                                : ReadHealth<::v1alpha1::DRAResourceHealth>(endpoint, &ctx, read);
    bool minor37;
    {
      absl::MutexLock lock(&mu_);
      minor37 = kubelet_.minor >= 37;
    }
    absl::MutexLock lock(&w->mu);
    w->ctx = nullptr;
    if (w->stop) return;
    const bool unsupported = st.error_code() == grpc::StatusCode::UNIMPLEMENTED;
    events_.Emit(unsupported ? "dra_health_unsupported" : "dra_health_ended",
                 {{"driver", driver}, {"service", service}, {"error", GoRpcError(st)}});
    // 1.37 takes Unimplemented as the answer; 1.36 tries again every 5 s.
    if (unsupported && minor37) return;
    // The kubelet's fixed retry; a stop ends the wait.
    w->mu.AwaitWithTimeout(absl::Condition(&w->stop), absl::Seconds(5));
    if (w->stop) return;
  }
}

std::map<std::string, KubeletSim::DraDeviceHealth> KubeletSim::DraHealth(
    const std::string& driver) {
  absl::MutexLock lock(&mu_);
  auto it = dra_health_.find(driver);
  return it == dra_health_.end() ? std::map<std::string, DraDeviceHealth>() : it->second;
}

void KubeletSim::DeleteNodeSlices() {
  // The real kubelet retries in the background; a start here reports the
  // failure as an event and goes on.
  auto fail = [this](const std::string& why) {
    events_.Emit("node_slices_delete_failed",
                 {{"node", options_.node_name}, {"error", why}});
  };
  absl::StatusOr<KubeConfig> kc = LoadKubeconfig(options_.kubeconfig);
  if (!kc.ok()) return fail(std::string(kc.status().message()));
  absl::StatusOr<std::unique_ptr<KubeClient>> client = KubeClient::Create(*kc);
  if (!client.ok()) return fail(std::string(client.status().message()));
  absl::StatusOr<nlohmann::json> group = (*client)->Get("/apis/resource.k8s.io");
  if (!group.ok()) return fail(std::string(group.status().message()));
  const std::string version = group->value("/preferredVersion/groupVersion"_json_pointer,
                                           std::string("resource.k8s.io/v1"));
  const std::string collection = absl::StrCat("/apis/", version, "/resourceslices");
  absl::StatusOr<nlohmann::json> list = (*client)->Get(
      absl::StrCat(collection, "?fieldSelector=spec.nodeName%3D", options_.node_name));
  if (!list.ok()) return fail(std::string(list.status().message()));
  int deleted = 0;
  for (const nlohmann::json& item : list->value("items", nlohmann::json::array())) {
    const std::string name = item.value("/metadata/name"_json_pointer, std::string());
    absl::StatusOr<nlohmann::json> r = (*client)->Delete(absl::StrCat(collection, "/", name));
    if (!r.ok() && r.status().code() != absl::StatusCode::kNotFound) {
      return fail(absl::StrCat("delete ", name, ": ", r.status().message()));
    }
    ++deleted;
  }
  events_.Emit("node_slices_deleted", {{"node", options_.node_name}, {"slices", deleted}});
}

std::optional<KubeletSim::DraDriver> KubeletSim::dra_driver(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = dra_drivers_.find(name);
  if (it == dra_drivers_.end()) return std::nullopt;
  return it->second;
}

int KubeletSim::dra_instances(const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (dra_drivers_.count(name) == 0) return 0;
  auto older = dra_older_.find(name);
  return 1 + (older == dra_older_.end() ? 0 : static_cast<int>(older->second.size()));
}

namespace {

// One DRA call in either package (their messages are the same).
template <typename Stub, typename Request, typename Response>
absl::StatusOr<nlohmann::json> DraCall(
    std::unique_ptr<Stub> stub,
    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    const std::vector<KubeletSim::DraClaim>& claims) {
  Request req;
  for (const KubeletSim::DraClaim& c : claims) {
    auto* rc = req.add_claims();
    rc->set_namespace_(c.namespace_);
    rc->set_name(c.name);
    rc->set_uid(c.uid);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(45)));
  Response resp;
  grpc::Status st = ((*stub).*method)(&ctx, req, &resp);
  if (!st.ok()) return absl::UnavailableError(GoRpcError(st));
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [uid, r] : resp.claims()) {
    nlohmann::json one = {{"error", r.error()}};
    if constexpr (std::is_same_v<Response, drav1::NodePrepareResourcesResponse> ||
                  std::is_same_v<Response, drav1beta1::NodePrepareResourcesResponse>) {
      nlohmann::json devices = nlohmann::json::array();
      for (const auto& d : r.devices()) {
        devices.push_back({{"pool", d.pool_name()},
                           {"device", d.device_name()},
                           {"request_names", std::vector<std::string>(d.request_names().begin(),
                                                                      d.request_names().end())},
                           {"cdi_device_ids", std::vector<std::string>(
                                                  d.cdi_device_ids().begin(),
                                                  d.cdi_device_ids().end())}});
      }
      one["devices"] = devices;
    }
    out[uid] = one;
  }
  return out;
}

}  // namespace

absl::StatusOr<nlohmann::json> KubeletSim::PrepareClaims(const std::string& driver,
                                                         const std::vector<DraClaim>& claims) {
  return DraClaims(driver, claims, /*prepare=*/true);
}

absl::StatusOr<nlohmann::json> KubeletSim::UnprepareClaims(const std::string& driver,
                                                           const std::vector<DraClaim>& claims) {
  return DraClaims(driver, claims, /*prepare=*/false);
}

absl::StatusOr<nlohmann::json> KubeletSim::DraClaims(const std::string& driver,
                                                     const std::vector<DraClaim>& claims,
                                                     bool prepare) {
  std::optional<DraDriver> d = dra_driver(driver);
  if (!d.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("DRA driver ", driver, " is not registered with this kubelet"));
  }
  auto channel = MakeUnixChannel(d->endpoint);
  absl::StatusOr<nlohmann::json> r;
  if (d->service == "v1.DRAPlugin") {
    r = prepare ? DraCall(drav1::DRAPlugin::NewStub(channel),
                          &drav1::DRAPlugin::Stub::NodePrepareResources, claims)
                : DraCall(drav1::DRAPlugin::NewStub(channel),
                          &drav1::DRAPlugin::Stub::NodeUnprepareResources, claims);
  } else {
    r = prepare ? DraCall(drav1beta1::DRAPlugin::NewStub(channel),
                          &drav1beta1::DRAPlugin::Stub::NodePrepareResources, claims)
                : DraCall(drav1beta1::DRAPlugin::NewStub(channel),
                          &drav1beta1::DRAPlugin::Stub::NodeUnprepareResources, claims);
  }
  if (r.ok() && prepare && !options_.cdi_dirs.empty()) {
    // What the runtime makes of each device's CDI names.
    for (auto& [uid, claim] : r->items()) {
      for (nlohmann::json& dev : claim["devices"]) {
        const CdiResolution cdi = ResolveCdiDevices(
            options_.cdi_dirs, dev["cdi_device_ids"].get<std::vector<std::string>>());
        dev["runtime"] = {{"edits", cdi.edits}, {"errors", cdi.errors}};
        for (const std::string& e : cdi.errors) {
          events_.Emit("cdi_unresolved", {{"driver", driver}, {"claim_uid", uid}, {"error", e}});
        }
      }
    }
  }
  events_.Emit(prepare ? "dra_prepared" : "dra_unprepared",
               {{"driver", driver},
                {"service", d->service},
                {"result", r.ok() ? *r : nlohmann::json(std::string(r.status().message()))}});
  return r;
}

}  // namespace dpproxy::sim
