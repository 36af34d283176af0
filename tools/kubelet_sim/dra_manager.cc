#include "tools/kubelet_sim/dra_manager.h"

#include <algorithm>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "proto/dra/v1/api.grpc.pb.h"
#include "proto/dra/v1beta1/api.grpc.pb.h"
#include "proto/dra_health/v1/api.grpc.pb.h"
#include "proto/dra_health/v1alpha1/api.grpc.pb.h"
#include "proxy/kube/kube_client.h"
#include "proxy/kube/kube_config.h"
#include "proxy/rpc/grpc_util.h"
#include "tools/kubelet_sim/cdi_registry.h"

namespace dpproxy::sim {

namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

DraManager::DraManager(Options options, EventLog* events)
    : options_(std::move(options)), events_(events) {}

DraManager::~DraManager() { Clear(); }

void DraManager::SetKubelet(int minor, const std::string& name) {
  absl::MutexLock lock(&mu_);
  minor_ = minor;
  kubelet_name_ = name;
}

bool DraManager::Serves(const std::string& driver) {
  absl::MutexLock lock(&mu_);
  return drivers_.count(driver) > 0;
}

void DraManager::Clear() {
  Stops stops;
  {
    absl::MutexLock lock(&mu_);
    drivers_.clear();
    older_.clear();
    for (auto& [driver, w] : watches_) stops.push_back(std::move(w));
    watches_.clear();
  }
  Join(std::move(stops));
  absl::MutexLock lock(&mu_);
  health_.clear();  // a kubelet's memory, once no stream writes it
}

void DraManager::StopHealthLocked(const std::string& driver, Stops* stops) {
  auto h = watches_.find(driver);
  if (h != watches_.end()) {
    stops->push_back(std::move(h->second));
    watches_.erase(h);
  }
  health_.erase(driver);
}

void DraManager::SocketRemoved(const std::string& path, const std::string& driver) {
  Stops stops;
  {
    absl::MutexLock lock(&mu_);
    auto current = drivers_.find(driver);
    if (current == drivers_.end()) return;
    std::vector<Driver>& older = older_[driver];
    if (minor_ >= 33 && current->second.registration != path) {
      // An instance registered before the current one: forgotten.
      older.erase(std::remove_if(older.begin(), older.end(),
                                 [&path](const Driver& d) { return d.registration == path; }),
                  older.end());
      events_->Emit("dra_instance_removed", {{"driver", driver}, {"socket", path}});
      return;
    }
    if (minor_ >= 33 && !older.empty()) {
      // The current instance went: the one registered before it serves.
      current->second = older.back();
      older.pop_back();
      events_->Emit("dra_driver_fallback", {{"driver", driver},
                                            {"socket", path},
                                            {"endpoint", current->second.endpoint}});
      StopHealthLocked(driver, &stops);
      StartHealthWatchLocked(driver, current->second.endpoint, current->second.health, &stops);
    } else {
      // The last instance, or (up to 1.32) any socket of the driver: by name.
      drivers_.erase(current);
      older_.erase(driver);
      events_->Emit("dra_driver_deregistered", {{"driver", driver}, {"socket", path}});
      StopHealthLocked(driver, &stops);
    }
  }
  Join(std::move(stops));
}

void DraManager::StartHealthWatchLocked(const std::string& driver, const std::string& endpoint,
                                        const std::string& service, Stops* stops) {
  StopHealthLocked(driver, stops);
  if (service.empty()) return;
  std::unique_ptr<HealthWatch>& w = watches_[driver];
  w = std::make_unique<HealthWatch>();
  HealthWatch* raw = w.get();
  raw->thread = std::thread(
      [this, raw, driver, endpoint, service] { WatchHealth(driver, endpoint, service, raw); });
}

std::string DraManager::Register(const pluginregistration::PluginInfo& info,
                                 const std::string& endpoint, const std::string& socket_path) {
  int minor;
  std::string kubelet_name;
  {
    absl::MutexLock lock(&mu_);
    minor = minor_;
    kubelet_name = kubelet_name_;
  }
  // The first service in the plugin's order that this release knows.
  std::vector<std::string> known = {"v1beta1.DRAPlugin"};
  if (minor >= 34) known.insert(known.begin(), "v1.DRAPlugin");
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
                        ") is supported by kubelet ", kubelet_name, " (",
                        absl::StrJoin(known, ", "), ")");
  }
  Stops stops;
  {
    absl::MutexLock lock(&mu_);
    auto current = drivers_.find(info.name());
    if (current != drivers_.end() && current->second.registration != socket_path) {
      // Another instance of the driver: 1.33+ keep the one it replaces to
      // fall back to; earlier releases forget it.
      if (minor >= 33) older_[info.name()].push_back(current->second);
      events_->Emit("dra_driver_replaced", {{"driver", info.name()},
                                           {"old_endpoint", current->second.endpoint},
                                           {"endpoint", endpoint},
                                           {"kept", minor >= 33}});
    }
    // 1.36 turns ResourceHealthStatus on: the kubelet watches every
    // driver's health (v1alpha1), whether it offers the service or not.
    // 1.37 only a driver that lists a health service, v1 first.
    std::string health;
    if (minor == 36) health = "v1alpha1.DRAResourceHealth";
    if (minor >= 37) {
      for (const char* h : {"v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"}) {
        if (health.empty() && std::find(info.supported_versions().begin(),
                                        info.supported_versions().end(),
                                        h) != info.supported_versions().end()) {
          health = h;
        }
      }
    }
    drivers_[info.name()] = Driver{endpoint, chosen, socket_path, health};
    events_->Emit("dra_driver_registered", {{"driver", info.name()},
                                           {"endpoint", endpoint},
                                           {"service", chosen},
                                           {"health_service", health}});
    if (minor >= 36) StartHealthWatchLocked(info.name(), endpoint, health, &stops);
  }
  Join(std::move(stops));
  return "";
}

void DraManager::Join(Stops stops) {
  for (std::unique_ptr<HealthWatch>& w : stops) {
    if (w == nullptr) continue;
    {
      absl::MutexLock lock(&w->mu);
      w->stop = true;
      if (w->ctx != nullptr) w->ctx->TryCancel();
    }
    if (w->thread.joinable()) w->thread.join();
  }
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

void DraManager::WatchHealth(const std::string& driver, const std::string& endpoint,
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
      std::map<std::string, DeviceHealth> now;
      int unhealthy = 0, unknown = 0;
      for (const auto& d : m.devices()) {
        DeviceHealth h;
        h.health = health::HealthStatus_Name(d.health());
        h.message = d.message();
        h.last_updated_time = d.last_updated_time();
        unhealthy += d.health() == health::UNHEALTHY;
        unknown += d.health() == health::UNKNOWN;
        now[absl::StrCat(d.device().pool_name(), "/", d.device().device_name())] = std::move(h);
      }
      absl::MutexLock lock(&mu_);
      health_[driver] = std::move(now);
      events_->Emit("dra_health", {{"driver", driver},
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
      minor37 = minor_ >= 37;
    }
    absl::MutexLock lock(&w->mu);
    w->ctx = nullptr;
    if (w->stop) return;
    const bool unsupported = st.error_code() == grpc::StatusCode::UNIMPLEMENTED;
    events_->Emit(unsupported ? "dra_health_unsupported" : "dra_health_ended",
                 {{"driver", driver}, {"service", service}, {"error", GoRpcError(st)}});
    // 1.37 takes Unimplemented as the answer; 1.36 tries again every 5 s.
    if (unsupported && minor37) return;
    // The kubelet's fixed retry; a stop ends the wait.
    w->mu.AwaitWithTimeout(absl::Condition(&w->stop), absl::Seconds(5));
    if (w->stop) return;
  }
}

std::map<std::string, DraManager::DeviceHealth> DraManager::Health(const std::string& driver) {
  absl::MutexLock lock(&mu_);
  auto it = health_.find(driver);
  return it == health_.end() ? std::map<std::string, DeviceHealth>() : it->second;
}

void DraManager::DeleteNodeSlices() {
  // The real kubelet retries in the background; a start here reports the
  // failure as an event and goes on.
  auto fail = [this](const std::string& why) {
    events_->Emit("node_slices_delete_failed",
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
  events_->Emit("node_slices_deleted", {{"node", options_.node_name}, {"slices", deleted}});
}

std::optional<DraManager::Driver> DraManager::driver(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = drivers_.find(name);
  if (it == drivers_.end()) return std::nullopt;
  return it->second;
}

int DraManager::instances(const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (drivers_.count(name) == 0) return 0;
  auto older = older_.find(name);
  return 1 + (older == older_.end() ? 0 : static_cast<int>(older->second.size()));
}

namespace {

// One DRA call in either package (their messages are the same).
template <typename Stub, typename Request, typename Response>
absl::StatusOr<nlohmann::json> DraCall(
    std::unique_ptr<Stub> stub,
    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    const std::vector<DraManager::Claim>& claims) {
  Request req;
  for (const DraManager::Claim& c : claims) {
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

absl::StatusOr<nlohmann::json> DraManager::Prepare(const std::string& driver,
                                                   const std::vector<Claim>& claims) {
  return Call(driver, claims, /*prepare=*/true);
}

absl::StatusOr<nlohmann::json> DraManager::Unprepare(const std::string& driver,
                                                     const std::vector<Claim>& claims) {
  return Call(driver, claims, /*prepare=*/false);
}

absl::StatusOr<nlohmann::json> DraManager::Call(const std::string& driver,
                                                const std::vector<Claim>& claims, bool prepare) {
  std::optional<Driver> d = this->driver(driver);
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
          events_->Emit("cdi_unresolved", {{"driver", driver}, {"claim_uid", uid}, {"error", e}});
        }
      }
    }
  }
  events_->Emit(prepare ? "dra_prepared" : "dra_unprepared",
               {{"driver", driver},
                {"service", d->service},
                {"result", r.ok() ? *r : nlohmann::json(std::string(r.status().message()))}});
  return r;
}

}  // namespace dpproxy::sim
