// The simulated kubelet's gRPC services: registration (kubelet.sock),
// pod-resources, the container runtime's view (CRI ListContainers) and the
// control API. Each answers from KubeletSim's public interface.
#include "tools/kubelet_sim/kubelet_sim_internal.h"

namespace dpproxy::sim {
namespace {

class RegistrationV1Beta1 final : public v1beta1::Registration::Service {
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

class RegistrationV1Alpha final : public deviceplugin::Registration::Service {
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

class PodResources final : public v1::PodResourcesLister::Service {
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

class Control final : public KubeletControl::Service {
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

class ContainerRuntime final : public runtime::v1::RuntimeService::Service {
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

}  // namespace

namespace kubelet_sim_internal {

std::unique_ptr<grpc::Service> NewRegistrationService(KubeletSim* sim, Personality personality) {
  if (personality == Personality::kV1Alpha) return std::make_unique<RegistrationV1Alpha>(sim);
  return std::make_unique<RegistrationV1Beta1>(sim);
}
std::unique_ptr<grpc::Service> NewPodResourcesService(KubeletSim* sim) {
  return std::make_unique<PodResources>(sim);
}
std::unique_ptr<grpc::Service> NewContainerRuntimeService(KubeletSim* sim) {
  return std::make_unique<ContainerRuntime>(sim);
}
std::unique_ptr<grpc::Service> NewControlService(KubeletSim* sim) {
  return std::make_unique<Control>(sim);
}

}  // namespace kubelet_sim_internal
}  // namespace dpproxy::sim
