#include "tools/sample_plugin/sample_plugin.h"

#include <unistd.h>

#include <functional>

#include <algorithm>
#include <map>

#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "proto/pluginregistration/api.grpc.pb.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/util/encoding.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/util/status_macros.h"
#include "tools/sample_plugin/control.grpc.pb.h"

namespace dpproxy::sample {
namespace {

std::string ResourceDomain(const std::string& resource) {
  return resource.substr(0, resource.find('/'));
}

std::string ResourceShortName(const std::string& resource) {
  size_t slash = resource.find('/');
  return slash == std::string::npos ? resource : resource.substr(slash + 1);
}

std::string EnvName(const std::string& resource) {
  std::string n = ResourceShortName(resource);
  for (char& c : n) c = absl::ascii_isalnum(static_cast<unsigned char>(c)) ? absl::ascii_toupper(c) : '_';
  return absl::StrCat("SAMPLE_", n, "_DEVICES");
}

std::string DefaultSocketName(const SamplePluginOptions& o) {
  if (!o.socket_name.empty()) return o.socket_name;
  if (o.fault == "shared-socket") return "sample.sock";  // whatever the resource
  std::string n = ResourceShortName(o.resource);
  for (char& c : n) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '-';
  }
  return absl::StrCat("sample-", n, ".sock");
}

std::string SocketPathFor(const SamplePluginOptions& o) {
  if (o.registration == RegistrationMode::kPluginWatcher) {
    return JoinPath(o.plugins_registry_dir, DefaultSocketName(o));
  }
  return JoinPath(DirName(o.kubelet_socket), DefaultSocketName(o));
}

std::string StableUuid(const std::string& resource, int index) {
  // FNV-1a 64 of resource and index, with two different seeds.
  std::string key = absl::StrCat(resource, "#", index);
  uint64_t a = Fnv64(key), b = Fnv64(key, 1469598103934665603ULL);
  return absl::StrFormat("%08x-%04x-%04x-%04x-%012x", a >> 32, (a >> 16) & 0xffff,
                         a & 0xffff, b >> 48, b & 0xffffffffffffULL);
}

}  // namespace

std::vector<std::string> DeviceIds(const SamplePluginOptions& o) {
  std::vector<std::string> ids;
  // unstable-ids: as a plugin that names devices by something of its own
  // process (an enumeration order, a handle), they differ after a restart.
  const std::string suffix = o.fault == "unstable-ids" ? absl::StrCat("-p", ::getpid()) : "";
  for (int i = 0; i < o.devices; ++i) {
    ids.push_back(absl::StrCat(
        absl::StrReplaceAll(o.id_pattern,
                            {{"{i}", absl::StrCat(i)},
                             {"{uuid}", StableUuid(o.resource, i)},
                             {"{ctrl}", std::string(1, static_cast<char>(i % 32))}}),
        suffix));
  }
  return ids;
}

absl::Status ValidateOptions(const SamplePluginOptions& o) {
  if (absl::Status s = ValidateResourceName(o.resource); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--resource: ", s.message(),
        " (an extended resource name looks like vendor.com/name and is not in the "
        "kubernetes.io namespace)"));
  }
  if (o.devices < 1 || o.devices > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices=", o.devices, " must be between 1 and 100000"));
  }
  if (absl::StrContains(o.id_pattern, "{ctrl}") && o.devices > 32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--id_pattern=\"", o.id_pattern, "\" with --devices=", o.devices,
        ": {ctrl} names at most 32 devices (one control character each)"));
  }
  if (o.devices > 1 && !absl::StrContains(o.id_pattern, "{i}") &&
      !absl::StrContains(o.id_pattern, "{uuid}") && !absl::StrContains(o.id_pattern, "{ctrl}")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--id_pattern=\"", o.id_pattern,
        "\" has neither {i} nor {uuid}, so all devices would have the same ID"));
  }
  if (!o.device_list_fault.empty() &&
      std::find(std::begin(kDeviceListFaults), std::end(kDeviceListFaults),
                o.device_list_fault) == std::end(kDeviceListFaults)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device_list_fault=", o.device_list_fault,
        " is not one of duplicate-id, empty-id, newline-id, unknown-health"));
  }
  if (!o.fault.empty()) {
    if (std::find(std::begin(kPluginFaults), std::end(kPluginFaults), o.fault) ==
        std::end(kPluginFaults)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--fault=", o.fault, " is not one of ",
          absl::StrJoin(std::begin(kPluginFaults), std::end(kPluginFaults), ", ")));
    }
    const bool beta_only = o.fault == "cdi-only" || o.fault == "preferred-wrong-size" ||
                           o.fault == "prestart-fails";
    if (beta_only && o.api != ApiVersion::kV1Beta1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--fault=", o.fault, " needs --api=v1beta1 (v1alpha has no such field or call)"));
    }
    if (o.fault == "preferred-wrong-size" && !o.preferred) {
      return absl::InvalidArgumentError("--fault=preferred-wrong-size needs --preferred");
    }
    if (o.fault == "prestart-fails" && !o.pre_start_required) {
      return absl::InvalidArgumentError("--fault=prestart-fails needs --pre_start_required");
    }
    if (o.fault == "watcher-wrong-type" && o.registration != RegistrationMode::kPluginWatcher) {
      return absl::InvalidArgumentError(
          "--fault=watcher-wrong-type needs --registration=plugin-watcher");
    }
  }
  for (const std::string& id : DeviceIds(o)) {
    if (id.empty() || id.size() > 63) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--id_pattern gives device ID \"", id, "\" of ", id.size(),
          " characters; IDs must be 1 to 63 characters"));
    }
  }
  if (o.api == ApiVersion::kV1Alpha) {
    if (o.preferred) {
      return absl::InvalidArgumentError(
          "--preferred needs --api=v1beta1 (v1alpha has no GetPreferredAllocation)");
    }
    if (o.pre_start_required) {
      return absl::InvalidArgumentError(
          "--pre_start_required needs --api=v1beta1 (v1alpha has no PreStartContainer)");
    }
    if (o.numa_nodes > 0) {
      return absl::InvalidArgumentError(
          "--numa_nodes needs --api=v1beta1 (v1alpha devices have no topology)");
    }
  }
  if (o.numa_nodes < 0 || o.numa_nodes > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--numa_nodes=", o.numa_nodes, " must be between 0 and 64"));
  }
  if (!o.flip_device.empty()) {
    std::vector<std::string> ids = DeviceIds(o);
    if (std::find(ids.begin(), ids.end(), o.flip_device) == ids.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--flip_device=", o.flip_device, " is not one of the devices (", ids.front(),
          " ... ", ids.back(), ")"));
    }
    if (o.flip_interval <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("--flip_device needs a positive --flip_interval");
    }
  }
  if (o.registration == RegistrationMode::kKubelet) {
    DPP_RETURN_IF_ERROR(ValidateSocketPath(o.kubelet_socket));
  }
  if (absl::StrContains(DefaultSocketName(o), "/")) {
    return absl::InvalidArgumentError("--socket_name must be a file name, not a path");
  }
  return ValidateSocketPath(SocketPathFor(o));
}

// --- Devices, responses and the services ------------------------------------------

class SamplePlugin::Impl {
 public:
  Impl(const SamplePluginOptions& o, EventLog* events, std::string socket_path)
      : o_(o), events_(events), socket_path_(std::move(socket_path)) {
    std::vector<std::string> ids = DeviceIds(o);
    for (size_t i = 0; i < ids.size(); ++i) {
      v1beta1::Device d;
      d.set_id(ids[i]);
      d.set_health(std::string(kHealthy));
      if (o.numa_nodes > 0) {
        d.mutable_topology()->add_nodes()->set_id(static_cast<int64_t>(i) % o.numa_nodes);
      }
      devices_.push_back(std::move(d));
    }
  }

  bool options_only_in_register() const { return o_.options_only_in_register; }
  bool panic_on_options() const { return o_.panic_on_options; }
  EventLog* events() { return events_; }
  // What panic_on_options does (SamplePlugin::Die); set before serving.
  std::function<void()> on_panic;

  v1beta1::DevicePluginOptions Options() const {
    v1beta1::DevicePluginOptions opts;
    opts.set_pre_start_required(o_.pre_start_required);
    opts.set_get_preferred_allocation_available(o_.preferred);
    return opts;
  }

  absl::Status SetHealth(const std::string& id, const std::string& health) {
    if (health != kHealthy && health != kUnhealthy) {
      return absl::InvalidArgumentError(absl::StrCat(
          "health \"", health, "\" is neither Healthy nor Unhealthy"));
    }
    absl::MutexLock lock(&mu_);
    for (v1beta1::Device& d : devices_) {
      if (d.id() == id) {
        if (d.health() != health) {
          d.set_health(health);
          ++version_;
          events_->Emit("health_changed", {{"device", id}, {"health", health}});
        }
        return absl::OkStatus();
      }
    }
    return absl::NotFoundError(absl::StrCat("no device with ID \"", id, "\""));
  }

  std::string Health(const std::string& id) {
    absl::MutexLock lock(&mu_);
    for (const v1beta1::Device& d : devices_) {
      if (d.id() == id) return d.health();
    }
    return "";
  }

  // Ends every open ListAndWatch stream (server restart) or all for good.
  void EndStreams(bool stopping) {
    absl::MutexLock lock(&mu_);
    ++epoch_;
    if (stopping) stopping_ = true;
  }

  // Runs one ListAndWatch stream: the full list at once, then on every change.
  void InjectDeviceListFault(std::vector<v1beta1::Device>* list) const {
    if (o_.fault == "no-devices") list->clear();
    if (o_.fault == "huge-list") {
      // 60,000 devices with 63-character IDs: about 4.6 MB, over the 4 MiB
      // a kubelet's gRPC client accepts.
      v1beta1::Device d;
      d.set_health(std::string(kHealthy));
      for (int i = 0; i < 60000; ++i) {
        d.set_id(absl::StrFormat("huge-%057d", i));
        list->push_back(d);
      }
    }
    const std::string& f = o_.device_list_fault;
    if (f.empty() || list->empty()) return;
    v1beta1::Device extra;
    extra.set_health(std::string(kHealthy));
    if (f == "duplicate-id") {
      list->push_back(list->front());
    } else if (f == "empty-id") {
      list->push_back(extra);
    } else if (f == "newline-id") {
      extra.set_id("bad\nid");
      list->push_back(extra);
    } else if (f == "unknown-health") {
      list->front().set_health("Sick");
    }
  }

  template <typename WriteFn>
  grpc::Status Stream(grpc::ServerContext* ctx, WriteFn write) {
    uint64_t my_epoch, seen = 0;
    {
      absl::MutexLock lock(&mu_);
      my_epoch = epoch_;
    }
    ++streams_;
    events_->Emit("list_and_watch_opened", {{"socket", socket_path_}});
    for (;;) {
      std::vector<v1beta1::Device> snapshot;
      bool send = false;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> bool {
          return stopping_ || epoch_ != my_epoch || version_ != seen;
        };
        mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
        if (stopping_ || epoch_ != my_epoch) return grpc::Status::OK;
        if (version_ != seen && seen != 0 && o_.fault == "stream-per-update") {
          // The bug: end this stream and expect the kubelet to open another
          // for the next list. No kubelet does; it reads the end as the
          // plugin gone.
          events_->Emit("list_and_watch_ended", {{"socket", socket_path_},
                                                 {"fault", o_.fault}});
          return grpc::Status::OK;
        }
        if (version_ != seen) {
          bool taken = o_.single_stream_updates && seen != 0 && delivered_ >= version_;
          seen = version_;
          if (!taken) {
            delivered_ = version_;
            snapshot = devices_;
            send = true;
          }
        }
      }
      if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
      if (send && first_list_delay_pending_.exchange(false)) {
        const absl::Time end = absl::Now() + o_.first_list_delay;
        while (absl::Now() < end && !ctx->IsCancelled()) {
          absl::SleepFor(std::min(absl::Milliseconds(10), end - absl::Now()));
        }
      }
      if (send) InjectDeviceListFault(&snapshot);
      if (send) {
        // Known from the moment they go out: the write returns only after
        // the transport took the list, and the kubelet may call by then.
        absl::MutexLock lock(&mu_);
        listed_ = true;
      }
      if (send && !write(snapshot)) return grpc::Status::OK;
    }
  }

  absl::Status CheckKnown(const std::vector<std::string>& ids) {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : ids) {
      bool found = std::any_of(devices_.begin(), devices_.end(),
                               [&](const v1beta1::Device& d) { return d.id() == id; });
      if (!found) {
        return absl::InvalidArgumentError(absl::StrCat(
            "invalid allocation request for \"", o_.resource, "\": unknown device: ", id));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<v1beta1::ContainerAllocateResponse> Respond(
      const std::vector<std::string>& ids) {
    DPP_RETURN_IF_ERROR(CheckKnown(ids));
    const std::string name = ResourceShortName(o_.resource);
    v1beta1::ContainerAllocateResponse r;
    if (o_.fault == "cdi-only") {
      for (const std::string& id : ids) {
        r.add_cdi_devices()->set_name(
            absl::StrCat(ResourceDomain(o_.resource), "/", name, "=", id));
      }
      return r;
    }
    // same-device-node: the node of the plugin's first device, whatever
    // was allocated (a plugin that caches one response).
    const std::string first = DeviceIds(o_).front();
    (*r.mutable_envs())[EnvName(o_.resource)] = absl::StrJoin(ids, ",");
    (*r.mutable_envs())["SAMPLE_PLUGIN_API"] =
        o_.api == ApiVersion::kV1Alpha ? "v1alpha" : "v1beta1";
    for (const std::string& id : ids) {
      v1beta1::Mount* m = r.add_mounts();
      m->set_host_path(absl::StrCat("/var/run/sample-plugin/", name, "/", id));
      m->set_container_path(absl::StrCat("/run/sample/", id));
      m->set_read_only(true);
      v1beta1::DeviceSpec* d = r.add_devices();
      const std::string& node = o_.fault == "same-device-node" ? first : id;
      d->set_host_path(absl::StrCat("/dev/sample/", node));
      d->set_container_path(absl::StrCat("/dev/sample/", node));
      d->set_permissions("rw");
      if (o_.api == ApiVersion::kV1Beta1) {
        r.add_cdi_devices()->set_name(absl::StrCat(ResourceDomain(o_.resource), "/", name, "=", id));
      }
    }
    if (!o_.control_node.empty()) {
      v1beta1::DeviceSpec* d = r.add_devices();
      d->set_host_path(o_.control_node);
      d->set_container_path(o_.control_node);
      d->set_permissions("rw");
    }
    if (o_.api == ApiVersion::kV1Beta1) {
      (*r.mutable_annotations())[absl::StrCat(ResourceDomain(o_.resource), "/devices")] =
          absl::StrJoin(ids, ",");
    }
    return r;
  }

  // Must-include first, then as few NUMA nodes as possible, higher IDs first.
  std::vector<std::string> Prefer(const std::vector<std::string>& available,
                                  const std::vector<std::string>& must, int size) {
    std::vector<std::string> out;
    for (const std::string& id : must) {
      if (static_cast<int>(out.size()) < size) out.push_back(id);
    }
    std::map<int64_t, std::vector<std::string>> by_node;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& id : available) {
        if (std::find(out.begin(), out.end(), id) != out.end()) continue;
        int64_t node = -1;
        for (const v1beta1::Device& d : devices_) {
          if (d.id() == id && d.topology().nodes_size() > 0) node = d.topology().nodes(0).id();
        }
        by_node[node].push_back(id);
      }
    }
    std::vector<std::vector<std::string>> groups;
    for (auto& [node, ids] : by_node) {
      std::sort(ids.rbegin(), ids.rend());
      groups.push_back(ids);
    }
    std::stable_sort(groups.begin(), groups.end(),
                     [](const auto& a, const auto& b) { return a.size() > b.size(); });
    for (const auto& g : groups) {
      for (const std::string& id : g) {
        if (static_cast<int>(out.size()) >= size) return out;
        out.push_back(id);
      }
    }
    return out;
  }

  grpc::Status Allocate(grpc::ServerContext* ctx,
                        const std::vector<std::vector<std::string>>& requests,
                        std::vector<v1beta1::ContainerAllocateResponse>* out) {
    ++allocate_calls_;
    Json reqs = Json::array();
    for (const auto& ids : requests) reqs.push_back(ids);
    events_->Emit("allocate", {{"container_requests", reqs}});
    if (o_.allocate_delay > absl::ZeroDuration()) {
      // The injected delay ends early when the caller gives up, as a real
      // plugin's work would be abandoned; that is recorded.
      const absl::Time end = absl::Now() + o_.allocate_delay;
      while (absl::Now() < end) {
        if (ctx->IsCancelled()) {
          events_->Emit("allocate_cancelled", {{"container_requests", reqs}});
          return grpc::Status(grpc::StatusCode::CANCELLED, "the caller cancelled");
        }
        absl::SleepFor(std::min(absl::Milliseconds(20), end - absl::Now()));
      }
    }
    if (!o_.fail_allocate.empty()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, o_.fail_allocate);
    }
    if (o_.fault == "no-container-response") return grpc::Status::OK;
    if (o_.devices_from_list_and_watch) {
      absl::MutexLock lock(&mu_);
      if (!listed_) {
        events_->Emit("allocate_before_list", {{"container_requests", reqs}});
        return grpc::Status(grpc::StatusCode::UNKNOWN,
                            "requested device does not exist (devices are learnt in "
                            "ListAndWatch, which has sent nothing yet)");
      }
    }
    for (const auto& ids : requests) {
      absl::StatusOr<v1beta1::ContainerAllocateResponse> r = Respond(ids);
      if (!r.ok()) return ToGrpcStatus(r.status());
      if (o_.allocate_padding > 0) {
        (*r->mutable_envs())["SAMPLE_PADDING"] = std::string(o_.allocate_padding, 'p');
      }
      out->push_back(*std::move(r));
    }
    return grpc::Status::OK;
  }

  PluginStatus Status() {
    PluginStatus st;
    st.set_resource(o_.resource);
    st.set_api(o_.api == ApiVersion::kV1Alpha ? "v1alpha" : "v1beta1");
    st.set_socket(socket_path_);
    st.set_registrations(registrations_);
    st.set_allocate_calls(allocate_calls_);
    st.set_preferred_allocation_calls(preferred_calls_);
    st.set_pre_start_calls(pre_start_calls_);
    st.set_list_and_watch_streams(streams_);
    absl::MutexLock lock(&mu_);
    st.set_last_registration_error(last_error_);
    for (const v1beta1::Device& d : devices_) {
      DeviceStatus* ds = st.add_devices();
      ds->set_id(d.id());
      ds->set_health(d.health());
    }
    return st;
  }

  void NoteRegistration(const absl::Status& s) {
    if (s.ok()) ++registrations_;
    absl::MutexLock lock(&mu_);
    last_error_ = s.ok() ? "" : std::string(s.message());
  }

  const SamplePluginOptions& o_;
  EventLog* const events_;
  const std::string socket_path_;
  std::atomic<int64_t> allocate_calls_{0}, preferred_calls_{0}, pre_start_calls_{0},
      streams_{0}, registrations_{0};

 private:
  absl::Mutex mu_;
  std::vector<v1beta1::Device> devices_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  bool listed_ ABSL_GUARDED_BY(mu_) = false;  // a first list was sent
  std::atomic<bool> first_list_delay_pending_{o_.first_list_delay > absl::ZeroDuration()};
};

namespace {

class BetaService final : public v1beta1::DevicePlugin::Service {
 public:
  explicit BetaService(SamplePlugin::Impl* impl) : impl_(impl) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* resp) override {
    if (impl_->panic_on_options()) {
      impl_->events()->Emit("panicked", {{"call", "GetDevicePluginOptions"}});
      impl_->on_panic();
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the plugin panicked");
    }
    if (impl_->options_only_in_register()) {
      impl_->events()->Emit("get_device_plugin_options_failed", {});
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          "grpc: error while marshaling: proto: Marshal called with nil");
    }
    *resp = impl_->Options();
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* w) override {
    return impl_->Stream(ctx, [w](const std::vector<v1beta1::Device>& devices) {
      v1beta1::ListAndWatchResponse r;
      for (const auto& d : devices) *r.add_devices() = d;
      return w->Write(r);
    });
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* resp) override {
    if (!impl_->o_.preferred) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "GetPreferredAllocation is not offered by this plugin (--preferred=false)");
    }
    ++impl_->preferred_calls_;
    for (const auto& cr : req->container_requests()) {
      std::vector<std::string> chosen = impl_->Prefer(
          {cr.available_deviceids().begin(), cr.available_deviceids().end()},
          {cr.must_include_deviceids().begin(), cr.must_include_deviceids().end()},
          cr.allocation_size());
      if (impl_->o_.fault == "preferred-wrong-size") {
        chosen.assign(cr.available_deviceids().begin(), cr.available_deviceids().end());
      }
      impl_->events_->Emit("preferred_allocation",
                           {{"available", std::vector<std::string>(
                                              cr.available_deviceids().begin(),
                                              cr.available_deviceids().end())},
                            {"size", cr.allocation_size()},
                            {"preferred", chosen}});
      auto* out = resp->add_container_responses();
      for (const std::string& id : chosen) out->add_deviceids(id);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext* ctx, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* resp) override {
    std::vector<std::vector<std::string>> requests;
    for (const auto& cr : req->container_requests()) {
      requests.emplace_back(cr.devices_ids().begin(), cr.devices_ids().end());
    }
    std::vector<v1beta1::ContainerAllocateResponse> out;
    grpc::Status st = impl_->Allocate(ctx, requests, &out);
    if (!st.ok()) return st;
    for (auto& r : out) *resp->add_container_responses() = std::move(r);
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*,
                                 const v1beta1::PreStartContainerRequest* req,
                                 v1beta1::PreStartContainerResponse*) override {
    ++impl_->pre_start_calls_;
    std::vector<std::string> ids(req->devices_ids().begin(), req->devices_ids().end());
    if (absl::Status s = impl_->CheckKnown(ids); !s.ok()) return ToGrpcStatus(s);
    if (impl_->o_.fault == "prestart-fails") {
      return grpc::Status(grpc::StatusCode::INTERNAL, "device reset failed (injected fault)");
    }
    impl_->events_->Emit("pre_start", {{"devices", ids}});
    return grpc::Status::OK;
  }

 private:
  SamplePlugin::Impl* const impl_;
};

class AlphaService final : public deviceplugin::DevicePlugin::Service {
 public:
  explicit AlphaService(SamplePlugin::Impl* impl) : impl_(impl) {}

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const deviceplugin::Empty*,
                            grpc::ServerWriter<deviceplugin::ListAndWatchResponse>* w) override {
    return impl_->Stream(ctx, [w](const std::vector<v1beta1::Device>& devices) {
      deviceplugin::ListAndWatchResponse r;
      for (const auto& d : devices) {
        auto* a = r.add_devices();
        a->set_id(d.id());
        a->set_health(d.health());
      }
      return w->Write(r);
    });
  }

  grpc::Status Allocate(grpc::ServerContext* ctx, const deviceplugin::AllocateRequest* req,
                        deviceplugin::AllocateResponse* resp) override {
    std::vector<v1beta1::ContainerAllocateResponse> out;
    grpc::Status st =
        impl_->Allocate(ctx, {{req->devicesids().begin(), req->devicesids().end()}}, &out);
    if (!st.ok()) return st;
    // Same field numbers for envs, mounts and devices: copy through the wire.
    std::string bytes;
    out[0].SerializeToString(&bytes);
    resp->ParseFromString(bytes);
    return grpc::Status::OK;
  }

 private:
  SamplePlugin::Impl* const impl_;
};

class WatcherService final : public pluginregistration::Registration::Service {
 public:
  explicit WatcherService(SamplePlugin::Impl* impl) : impl_(impl) {}

  grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                       pluginregistration::PluginInfo* info) override {
    info->set_type(impl_->o_.fault == "watcher-wrong-type" ? "CSIPlugin"
                                                           : std::string(kDevicePluginType));
    info->set_name(impl_->o_.resource);
    info->set_endpoint(impl_->socket_path_);
    info->add_supported_versions(impl_->o_.api == ApiVersion::kV1Alpha
                                     ? std::string(kV1AlphaVersion)
                                     : std::string(kV1Beta1Version));
    impl_->events_->Emit("get_info", {{"socket", impl_->socket_path_}});
    return grpc::Status::OK;
  }

  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                        const pluginregistration::RegistrationStatus* st,
                                        pluginregistration::RegistrationStatusResponse*) override {
    impl_->NoteRegistration(st->plugin_registered() ? absl::OkStatus()
                                                    : absl::UnknownError(st->error()));
    impl_->events_->Emit(st->plugin_registered() ? "registered" : "registration_failed",
                         {{"via", "plugin-watcher"}, {"error", st->error()}});
    return grpc::Status::OK;
  }

 private:
  SamplePlugin::Impl* const impl_;
};

class ControlService final : public PluginControl::Service {
 public:
  explicit ControlService(SamplePlugin* plugin) : plugin_(plugin) {}
  grpc::Status SetHealth(grpc::ServerContext*, const SetHealthRequest* req,
                         PluginStatus* resp) override {
    if (absl::Status s = plugin_->SetHealth(req->device_id(), req->health()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    *resp = plugin_->Status();
    return grpc::Status::OK;
  }
  grpc::Status GetStatus(grpc::ServerContext*, const GetStatusRequest*,
                         PluginStatus* resp) override {
    *resp = plugin_->Status();
    return grpc::Status::OK;
  }

 private:
  SamplePlugin* const plugin_;
};

}  // namespace

// Services outlive the servers, which are rebuilt when the socket is recreated.
struct SamplePlugin::Services {
  std::unique_ptr<BetaService> beta;
  std::unique_ptr<AlphaService> alpha;
  std::unique_ptr<WatcherService> watcher;
  // A callback generic service can serve only one server in its life, so
  // each server gets its own; it is replaced after the old server is gone.
  std::unique_ptr<GoStyleUnknownHandler> unknown;
  std::vector<std::string> served;
  std::unique_ptr<ControlService> control;
};

// --- SamplePlugin -------------------------------------------------------------------

SamplePlugin::SamplePlugin(SamplePluginOptions options)
    : options_(std::move(options)), socket_path_(SocketPathFor(options_)) {
  impl_ = std::make_unique<Impl>(options_, &events_, socket_path_);
  impl_->on_panic = [this] { Die(); };
  services_ = std::make_unique<Services>();
  std::vector<std::string> served;
  if (options_.api == ApiVersion::kV1Beta1) {
    services_->beta = std::make_unique<BetaService>(impl_.get());
    served.push_back("v1beta1.DevicePlugin");
  } else {
    services_->alpha = std::make_unique<AlphaService>(impl_.get());
    served.push_back("deviceplugin.DevicePlugin");
  }
  if (options_.registration == RegistrationMode::kPluginWatcher) {
    services_->watcher = std::make_unique<WatcherService>(impl_.get());
    served.push_back("pluginregistration.Registration");
  }
  services_->served = served;
  services_->control = std::make_unique<ControlService>(this);
}

SamplePlugin::~SamplePlugin() {
  StopControl();
  Stop();
}

void SamplePlugin::ServeLocked() {
  Services* svc = services_.get();
  server_.reset();
  svc->unknown = std::make_unique<GoStyleUnknownHandler>(svc->served);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(UnixAddress(socket_path_), grpc::InsecureServerCredentials());
  if (svc->beta) builder.RegisterService(svc->beta.get());
  if (svc->alpha) builder.RegisterService(svc->alpha.get());
  if (svc->watcher) builder.RegisterService(svc->watcher.get());
  builder.RegisterCallbackGenericService(svc->unknown.get());
  server_ = builder.BuildAndStart();
}

absl::Status SamplePlugin::WriteCdiSpec() {
  const std::string domain = ResourceDomain(options_.resource);
  const std::string name = ResourceShortName(options_.resource);
  nlohmann::json devices = nlohmann::json::array();
  for (const std::string& id : DeviceIds(options_)) {
    const std::string node = absl::StrCat("/dev/sample-cdi/", id);
    devices.push_back(
        {{"name", id},
         {"containerEdits",
          {{"deviceNodes", {{{"path", node}, {"hostPath", node}, {"permissions", "rw"}}}}}}});
  }
  const nlohmann::json spec = {{"cdiVersion", "0.6.0"},
                               {"kind", absl::StrCat(domain, "/", name)},
                               {"devices", devices}};
  const std::string path =
      JoinPath(options_.cdi_dir, absl::StrCat("sample-plugin-", domain, "-", name, ".json"));
  DPP_RETURN_IF_ERROR(MakeDirs(options_.cdi_dir));
  DPP_RETURN_IF_ERROR(WriteFileAtomic(path, spec.dump(1)));
  events_.Emit("cdi_spec_written", {{"path", path}});
  return absl::OkStatus();
}

absl::Status SamplePlugin::Start() {
  DPP_RETURN_IF_ERROR(ValidateOptions(options_));
  DPP_RETURN_IF_ERROR(MakeDirs(DirName(socket_path_)));
  if (Faulty("register-before-serve") && options_.registration == RegistrationMode::kKubelet) {
    // The bug: one Register before the socket is served. A 1.25+ kubelet
    // dials back inside Register and fails; this plugin does not try again
    // until the kubelet restarts.
    absl::MutexLock lock(&check_mu_);
    std::optional<FileId> id = StatFileId(options_.kubelet_socket);
    if (id.has_value()) {
      absl::Status s = RegisterOnce();
      last_registration_ = s;
      impl_->NoteRegistration(s);
      (s.ok() ? registered_kubelet_ : failed_kubelet_) = id;
    }
  }
  {
    absl::MutexLock lock(&server_mu_);
    ServeLocked();
    if (server_ == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", socket_path_));
    }
  }
  if (!options_.cdi_dir.empty() && options_.api == ApiVersion::kV1Beta1) {
    DPP_RETURN_IF_ERROR(WriteCdiSpec());
  }
  started_ = true;
  // The count and the first few IDs: a line per device ID would be
  // megabytes at 100,000 devices.
  std::vector<std::string> ids = DeviceIds(options_);
  const size_t count = ids.size();
  if (ids.size() > 8) ids.resize(8);
  events_.Emit("serving", {{"socket", socket_path_},
                           {"resource", options_.resource},
                           {"api", options_.api == ApiVersion::kV1Alpha ? "v1alpha" : "v1beta1"},
                           {"devices", count},
                           {"first_devices", ids}});
  // Register now (CheckKubelet), then on every change of the directory.
  CheckKubelet();
  // Our socket's directory: device-plugins/ (beside kubelet.sock) or
  // plugins_registry/.
  {
    absl::MutexLock lock(&wake_mu_);
    stop_registrar_ = false;
  }
  registrar_ = std::thread([this] { RegistrarLoop(); });
  watcher_ = std::make_unique<DirWatcher>(
      DirName(socket_path_), [this](const DirWatcher::Event&) { OnDirEvent(); });
  DPP_RETURN_IF_ERROR(watcher_->Start());
  if (!options_.flip_device.empty()) flipper_ = std::thread([this] { FlipLoop(); });
  return absl::OkStatus();
}

void SamplePlugin::Stop() {
  if (!started_) return;
  started_ = false;
  impl_->EndStreams(/*stopping=*/true);
  if (watcher_) {
    watcher_->Stop();
    watcher_.reset();
  }
  {
    absl::MutexLock lock(&wake_mu_);
    stop_registrar_ = true;
  }
  if (registrar_.joinable()) registrar_.join();
  if (flipper_.joinable()) flipper_.join();
  if (death_.joinable()) death_.join();
  {
    absl::MutexLock lock(&server_mu_);
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now());
      server_->Wait();
      server_.reset();
    }
  }
  ::unlink(socket_path_.c_str());
  events_.Emit("stopped", {{"socket", socket_path_}});
}

void SamplePlugin::FlipLoop() {
  for (;;) {
    absl::Time until = absl::Now() + options_.flip_interval;
    while (absl::Now() < until) {
      if (!started_) return;
      absl::SleepFor(std::min(absl::Milliseconds(100), until - absl::Now()));
    }
    if (!started_) return;
    std::string h = impl_->Health(options_.flip_device);
    (void)SetHealth(options_.flip_device,
                    h == kHealthy ? std::string(kUnhealthy) : std::string(kHealthy));
  }
}

absl::Status SamplePlugin::SetHealth(const std::string& id, const std::string& health) {
  return impl_->SetHealth(id, health);
}

PluginStatus SamplePlugin::Status() { return impl_->Status(); }

absl::Status SamplePlugin::last_registration() {
  absl::MutexLock lock(&check_mu_);
  return last_registration_;
}

bool SamplePlugin::ServeAgainIfRemoved() {
  absl::MutexLock slock(&server_mu_);
  if (dead_) return false;
  // This plugin never looks at its own socket.
  if (options_.restart_signal == RestartSignal::kKubeletSocket) return false;
  if (Faulty("late-wipe-blind")) {
    // The bug: look at our socket only when kubelet.sock changed, so a
    // wipe the kubelet finishes after its new socket appears goes unseen.
    std::optional<FileId> kubelet = StatFileId(options_.kubelet_socket);
    if (kubelet == blind_kubelet_) return false;
    blind_kubelet_ = kubelet;
  }
  if (PathExists(socket_path_)) {
    gone_since_.reset();
    return false;
  }
  if (Faulty("slow-reserve")) {
    // Not a bug: a plugin that polls for its socket serves it again a
    // while after it was removed, and registers at once on a new
    // kubelet.sock, so its first Register after a kubelet start names a
    // socket that is not there yet. It recovers on the next poll.
    if (!gone_since_.has_value()) gone_since_ = absl::Now();
    if (absl::Now() - *gone_since_ < absl::Milliseconds(1500)) return false;
    gone_since_.reset();
  }
  ServeAnewLocked();
  socket_recreated_ = true;
  return true;
}

void SamplePlugin::ServeAnewLocked() {
  impl_->EndStreams(/*stopping=*/false);
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
  ServeLocked();
  events_.Emit("socket_recreated", {{"socket", socket_path_}, {"ok", server_ != nullptr}});
}

void SamplePlugin::RestartServer() {
  absl::MutexLock slock(&server_mu_);
  if (!dead_) ServeAnewLocked();
}

void SamplePlugin::Die() {
  if (dead_.exchange(true)) return;
  if (options_.exit_on_panic) {
    // What a Go program prints and does on an unrecovered panic.
    static const char kPanic[] =
        "panic: runtime error: invalid memory address or nil pointer dereference\n";
    (void)!::write(2, kPanic, sizeof(kPanic) - 1);
    ::_exit(2);
  }
  // Not from the handler's thread: the server waits for its handlers.
  death_ = std::thread([this] {
    absl::MutexLock slock(&server_mu_);
    impl_->EndStreams(/*stopping=*/true);
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now());
      server_->Wait();
      server_.reset();
    }
    ::unlink(socket_path_.c_str());
    events_.Emit("died", {{"socket", socket_path_}});
  });
}

void SamplePlugin::OnDirEvent() {
  if (!started_) return;
  // The kubelet removes our socket when it restarts: serve again at once,
  // even while a registration is in flight (its dial then finds the
  // socket); registering is the registrar thread's job.
  ServeAgainIfRemoved();
  absl::MutexLock lock(&wake_mu_);
  wake_ = true;
}

void SamplePlugin::RegistrarLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&wake_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) {
        return wake_ || stop_registrar_;
      };
      wake_mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (stop_registrar_) return;
      wake_ = false;
    }
    CheckKubelet();
  }
}

void SamplePlugin::CheckKubelet() {
  if (!started_) return;
  ServeAgainIfRemoved();
  absl::MutexLock lock(&check_mu_);
  if (socket_recreated_.exchange(false)) {
    // Only a kubelet start removes our socket: whatever kubelet.sock is
    // there now belongs to a new kubelet.
    registered_kubelet_.reset();
    failed_kubelet_.reset();
  }
  if (options_.registration != RegistrationMode::kKubelet || dead_) return;
  std::optional<FileId> id = StatFileId(options_.kubelet_socket);
  if (!id.has_value()) return;  // no kubelet yet: wait for it
  if (registered_kubelet_ == id || failed_kubelet_ == id) return;
  // Registered, and its own socket still there: a new kubelet.sock alone
  // goes unseen.
  if (options_.restart_signal == RestartSignal::kOwnSocket && registered_kubelet_.has_value()) {
    return;
  }
  if (options_.restart_signal == RestartSignal::kKubeletSocket &&
      (registered_kubelet_.has_value() || failed_kubelet_.has_value())) {
    RestartServer();
  }
  if (Faulty("no-reregister") && impl_->registrations_ > 0) return;
  if (registered_kubelet_.has_value()) {
    events_.Emit("kubelet_restart_detected", {{"kubelet_socket", options_.kubelet_socket}});
  }
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  absl::Status s;
  for (;;) {
    // Never ask a kubelet to dial a socket that is not served: a kubelet
    // that (re)started while we retried may have wiped it.
    ServeAgainIfRemoved();
    s = RegisterOnce();
    if (s.ok() || s.code() != absl::StatusCode::kUnavailable || absl::Now() >= deadline ||
        !started_) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  last_registration_ = s;
  impl_->NoteRegistration(s);
  if (s.ok()) {
    registered_kubelet_ = id;
    failed_kubelet_.reset();
  } else {
    failed_kubelet_ = id;
  }
}

absl::Status SamplePlugin::RegisterOnce() {
  auto channel = MakeUnixChannel(options_.kubelet_socket);
  if (!WaitForConnected(channel.get(), absl::Seconds(1)).ok()) {
    return absl::UnavailableError(
        absl::StrCat("kubelet socket ", options_.kubelet_socket, " is not accepting connections"));
  }
  grpc::ClientContext ctx;
  // A 1.25+ kubelet dials back and may take up to 10 s to give up.
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(15)));
  const std::string endpoint = DefaultSocketName(options_);
  grpc::Status st;
  std::string version;
  if (options_.api == ApiVersion::kV1Beta1) {
    v1beta1::RegisterRequest req;
    version = !options_.register_version.empty() ? options_.register_version
              : Faulty("wrong-version")          ? "v1"
                                                 : std::string(kV1Beta1Version);
    req.set_version(version);
    req.set_endpoint(endpoint);
    req.set_resource_name(options_.resource);
    if (!options_.panic_on_options) *req.mutable_options() = impl_->Options();
    v1beta1::Empty resp;
    st = v1beta1::Registration::NewStub(channel)->Register(&ctx, req, &resp);
  } else {
    deviceplugin::RegisterRequest req;
    version = !options_.register_version.empty() ? options_.register_version
              : Faulty("wrong-version")          ? "v1alpha1"
                                                 : std::string(kV1AlphaVersion);
    req.set_version(version);
    req.set_endpoint(endpoint);
    req.set_resource_name(options_.resource);
    deviceplugin::Empty resp;
    st = deviceplugin::Registration::NewStub(channel)->Register(&ctx, req, &resp);
  }
  if (!st.ok()) {
    events_.Emit("registration_failed", {{"kubelet_socket", options_.kubelet_socket},
                                         {"version", version},
                                         {"code", GrpcCodeName(st.error_code())},
                                         {"error", st.error_message()}});
    // A connection that broke mid-call is worth retrying; an answer is not.
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::UnavailableError(DescribeGrpcStatus(st));
    }
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        DescribeGrpcStatus(st));
  }
  events_.Emit("registered", {{"kubelet_socket", options_.kubelet_socket},
                              {"version", version},
                              {"endpoint", endpoint},
                              {"resource", options_.resource}});
  return absl::OkStatus();
}

absl::Status SamplePlugin::StartControl(const std::string& socket_path) {
  DPP_RETURN_IF_ERROR(ValidateSocketPath(socket_path));
  ControlService* svc = services_->control.get();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(UnixAddress(socket_path), grpc::InsecureServerCredentials());
  builder.RegisterService(svc);
  control_server_ = builder.BuildAndStart();
  if (control_server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", socket_path));
  }
  return absl::OkStatus();
}

void SamplePlugin::StopControl() {
  if (control_server_) {
    control_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    control_server_->Wait();
    control_server_.reset();
  }
}

}  // namespace dpproxy::sample
