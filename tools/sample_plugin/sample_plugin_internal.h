// File: sample_plugin_internal.h
//
// What the files of SamplePlugin share (sample_plugin_options.cc: the
// options and device IDs; sample_plugin.cc: the services, serving and
// registration): the names it derives from its resource, and the devices
// and answers (SamplePlugin::Impl). Not for users of the plugin: include
// sample_plugin.h.
#ifndef DPPROXY_TOOLS_SAMPLE_PLUGIN_SAMPLE_PLUGIN_INTERNAL_H_
#define DPPROXY_TOOLS_SAMPLE_PLUGIN_SAMPLE_PLUGIN_INTERNAL_H_

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

// "example.com" of "example.com/gpu", and "gpu".
std::string ResourceDomain(const std::string& resource);
std::string ResourceShortName(const std::string& resource);
// The environment variable an Allocate answer sets: SAMPLE_GPU_DEVICES.
std::string EnvName(const std::string& resource);
// The socket's file name (--socket_name, or one made from the resource),
// and its path.
std::string DefaultSocketName(const SamplePluginOptions& o);
std::string SocketPathFor(const SamplePluginOptions& o);
// A UUID-shaped ID, the same for a resource and index in every run.
std::string StableUuid(const std::string& resource, int index);

class SamplePlugin::Impl {
 public:
  Impl(const SamplePluginOptions& o, EventLog* events, std::string socket_path)
      : o_(o), events_(events), socket_path_(std::move(socket_path)) {
    devices_ = MakeDevices(o, {});
  }

  // Lists the devices of --devices=`count` from now on, as hardware
  // plugged in or taken out; those listed already keep their health.
  absl::Status SetDeviceCount(int count) {
    if (count < 1 || count > kMaxDevicesAtRuntime) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a device count of ", count, " is not between 1 and ", kMaxDevicesAtRuntime));
    }
    SamplePluginOptions o = o_;
    o.devices = count;
    absl::MutexLock lock(&mu_);
    std::map<std::string, std::string> health;
    for (const v1beta1::Device& d : devices_) health[d.id()] = d.health();
    devices_ = MakeDevices(o, health);
    ++version_;
    events_->Emit("device_count_changed", {{"devices", count}});
    return absl::OkStatus();
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

  // The kubelet asked for the options (a 1.25+ kubelet's dial-back during
  // Register), on the server of the serve counted now.
  void NoteOptionsAsked() {
    options_serve_ = serves_.load();
    ++options_asks_;
  }
  // Counted before each new server listens (the old one gone).
  void NoteServe() { ++serves_; }
  int64_t options_asks() const { return options_asks_; }
  // Whether the last options asked were asked of the server serving now.
  bool OptionsAskedOfCurrentServer() const { return options_serve_.load() == serves_.load(); }

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
  std::atomic<uint64_t> serves_{0}, options_serve_{0};
  std::atomic<int64_t> options_asks_{0};

 private:
  absl::Mutex mu_;
  // The devices `o` describes; an ID in `health` keeps that health.
  static std::vector<v1beta1::Device> MakeDevices(const SamplePluginOptions& o,
                                                  const std::map<std::string, std::string>& health) {
    std::vector<std::string> ids = DeviceIds(o);
    std::vector<v1beta1::Device> out;
    out.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      v1beta1::Device d;
      auto it = health.find(ids[i]);
      d.set_health(it != health.end() ? it->second : std::string(kHealthy));
      d.set_id(std::move(ids[i]));
      if (o.numa_nodes > 0) {
        d.mutable_topology()->add_nodes()->set_id(static_cast<int64_t>(i) % o.numa_nodes);
      }
      out.push_back(std::move(d));
    }
    return out;
  }

  std::vector<v1beta1::Device> devices_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  bool listed_ ABSL_GUARDED_BY(mu_) = false;  // a first list was sent
  std::atomic<bool> first_list_delay_pending_{o_.first_list_delay > absl::ZeroDuration()};
};

}  // namespace dpproxy::sample

#endif  // DPPROXY_TOOLS_SAMPLE_PLUGIN_SAMPLE_PLUGIN_INTERNAL_H_
