#include "proxy/holders/pod_resources_view.h"

#include <sys/stat.h>
#include <unistd.h>

#include <set>

#include <glog/logging.h>
#include <grpcpp/client_context.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/kubelet_side/dra/device_names.h"
#include "proxy/kubelet_side/dra/resource_slices.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"

namespace dpproxy {

ClaimDeviceIndex ClaimDeviceIndex::From(StateKeeper& keeper, const std::string& driver,
                                        const std::string& node) {
  ClaimDeviceIndex index;
  if (driver.empty()) return index;
  std::map<std::string, std::string> pools;  // resource -> pool name
  // The claims' allocations only (the keeper indexes them by claim): the
  // others are never read.
  for (const auto& [uid, allocations] : keeper.Claims()) {
    for (const state::Allocation& a : allocations) {
      auto pool = pools.find(a.resource());
      if (pool == pools.end()) {
        PoolSpec spec;
        spec.driver = driver;
        spec.node = node;
        spec.resource = a.resource();
        pool = pools.emplace(a.resource(), PoolName(spec)).first;
      }
      for (const std::string& id : a.device_ids()) {
        index.devices_[{a.claim().namespace_(), a.claim().name(), pool->second,
                        DraDeviceName(id)}] = {a.resource(), id};
      }
    }
  }
  return index;
}

const std::pair<std::string, std::string>* ClaimDeviceIndex::Find(const Key& key) const {
  auto it = devices_.find(key);
  return it == devices_.end() ? nullptr : &it->second;
}

int AddClaimDevices(const std::string& driver, const ClaimDeviceIndex& index,
                    v1::PodResources* pod) {
  if (driver.empty()) return 0;
  int added = 0;
  for (v1::ContainerResources& c : *pod->mutable_containers()) {
    std::set<std::pair<std::string, std::string>> listed;
    for (const v1::ContainerDevices& d : c.devices()) {
      for (const std::string& id : d.device_ids()) listed.insert({d.resource_name(), id});
    }
    for (const v1::DynamicResource& dr : c.dynamic_resources()) {
      for (const v1::ClaimResource& cr : dr.claim_resources()) {
        if (cr.driver_name() != driver) continue;
        const std::pair<std::string, std::string>* device = index.Find(
            {dr.claim_namespace(), dr.claim_name(), cr.pool_name(), cr.device_name()});
        if (device == nullptr || !listed.insert(*device).second) continue;
        // As the kubelet lists device-plugin devices: one entry per ID.
        v1::ContainerDevices* d = c.add_devices();
        d->set_resource_name(device->first);
        d->add_device_ids(device->second);
        ++added;
      }
    }
  }
  return added;
}

int AddDraDevices(const DraResources& resources, v1::AllocatableResourcesResponse* resp) {
  std::set<std::pair<std::string, std::string>> listed;
  for (const v1::ContainerDevices& d : resp->devices()) {
    for (const std::string& id : d.device_ids()) listed.insert({d.resource_name(), id});
  }
  int added = 0;
  for (const auto& [resource, list] : resources) {
    if (list == nullptr) continue;
    for (int i = 0; i < list->size(); ++i) {
      const DeviceList::View d = list->device(i);
      if (d.health != kHealthy || !listed.insert({resource, std::string(d.id)}).second) continue;
      v1::ContainerDevices* cd = resp->add_devices();
      cd->set_resource_name(resource);
      cd->add_device_ids(std::string(d.id));
      v1beta1::TopologyInfo topology;
      if (d.has_topology && topology.ParseFromArray(d.topology.data(),
                                                    static_cast<int>(d.topology.size()))) {
        for (const v1beta1::NUMANode& n : topology.nodes()) {
          cd->mutable_topology()->add_nodes()->set_id(n.id());
        }
      }
      ++added;
    }
  }
  return added;
}

// The three calls: asked of the kubelet, its answer passed on with the
// claims' devices (and the devices of resources served through DRA) added.
class PodResourcesView::Service final : public v1::PodResourcesLister::Service {
 public:
  explicit Service(PodResourcesView* view) : view_(view) {}

  grpc::Status List(grpc::ServerContext* ctx, const v1::ListPodResourcesRequest* req,
                    v1::ListPodResourcesResponse* resp) override {
    grpc::Status st = Ask(ctx, &v1::PodResourcesLister::Stub::List, *req, resp);
    if (!st.ok()) return st;
    const ClaimDeviceIndex index = Index();
    for (v1::PodResources& pod : *resp->mutable_pod_resources()) {
      AddClaimDevices(view_->options_.driver, index, &pod);
    }
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetPodResourcesRequest* req,
                   v1::GetPodResourcesResponse* resp) override {
    grpc::Status st = Ask(ctx, &v1::PodResourcesLister::Stub::Get, *req, resp);
    if (!st.ok()) return st;
    AddClaimDevices(view_->options_.driver, Index(), resp->mutable_pod_resources());
    return grpc::Status::OK;
  }
  grpc::Status GetAllocatableResources(grpc::ServerContext* ctx,
                                       const v1::AllocatableResourcesRequest* req,
                                       v1::AllocatableResourcesResponse* resp) override {
    grpc::Status st = Ask(ctx, &v1::PodResourcesLister::Stub::GetAllocatableResources, *req, resp);
    if (!st.ok() || !view_->options_.dra_resources) return st;
    AddDraDevices(view_->options_.dra_resources(), resp);
    return grpc::Status::OK;
  }

 private:
  ClaimDeviceIndex Index() {
    return ClaimDeviceIndex::From(*view_->keeper_, view_->options_.driver, view_->options_.node);
  }

  // The kubelet's answer, within the caller's deadline (10 s at most); its
  // error, naming the kubelet's socket, if it has none.
  template <typename Request, typename Response>
  grpc::Status Ask(grpc::ServerContext* ctx,
                   grpc::Status (v1::PodResourcesLister::Stub::*method)(grpc::ClientContext*,
                                                                         const Request&,
                                                                         Response*),
                   const Request& req, Response* resp) {
    const std::string& socket = view_->options_.kubelet_socket;
    auto stub = v1::PodResourcesLister::NewStub(MakeUnixChannel(socket));
    grpc::ClientContext out;
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    const absl::Time theirs = absl::FromChrono(ctx->deadline());
    if (theirs < deadline) deadline = theirs;
    out.set_deadline(absl::ToChronoTime(deadline));
    grpc::Status st = ((*stub).*method)(&out, req, resp);
    if (st.ok()) return st;
    return grpc::Status(st.error_code(), absl::StrCat("the kubelet's pod-resources API at ",
                                                      socket, ": ", st.error_message()));
  }

  PodResourcesView* const view_;
};

PodResourcesView::PodResourcesView(Options options, StateKeeper* keeper)
    : options_(std::move(options)), keeper_(keeper) {}

PodResourcesView::~PodResourcesView() { Stop(); }

absl::Status PodResourcesView::Start() {
  if (absl::Status s = ValidateSocketPath(options_.socket); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pod_resources_socket=", options_.socket, ": ", s.message()));
  }
  struct stat dir;
  if (::stat(DirName(options_.socket).c_str(), &dir) != 0 || !S_ISDIR(dir.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--pod_resources_socket=", options_.socket, ": its directory does not exist"));
  }
  service_ = std::make_unique<Service>(this);
  grpc::ServerBuilder b;
  b.RegisterService(service_.get());
  absl::StatusOr<std::unique_ptr<grpc::Server>> server =
      StartServerAt(b, options_.socket, 0700);
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("--pod_resources_socket: ", server.status().message()));
  }
  server_ = *std::move(server);
  struct stat st;
  if (::stat(options_.socket.c_str(), &st) == 0) inode_ = st.st_ino;
  LOG(INFO) << "pod-resources API with DRA claims' devices listed as device-plugin devices at "
            << options_.socket << " (the kubelet's: " << options_.kubelet_socket << ")";
  return absl::OkStatus();
}

void PodResourcesView::Stop() {
  if (server_ == nullptr) return;
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  server_.reset();
  struct stat st;
  if (::lstat(options_.socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == inode_) {
    ::unlink(options_.socket.c_str());
  }
}

}  // namespace dpproxy
