// File: device_plugin_side.h
//
// dpproxy toward a kubelet that speaks the device-plugin API: one device
// plugin per resource, each a DevicePluginServer on a socket of its own
// (device_plugin_server.h), kept served and registered by the Registrar
// (registrar.h), with a watch on the kubelet's directory (device-plugins/,
// or plugins_registry/ with the plugin watcher) so that a kubelet start is
// seen at once.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_DEVICE_PLUGIN_SIDE_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_DEVICE_PLUGIN_SIDE_H_

#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proxy/config/proxy_config.h"
#include "proxy/events/event_log.h"
#include "proxy/events/telemetry.h"
#include "proxy/kubelet_side/device_plugin/device_plugin_server.h"
#include "proxy/kubelet_side/device_plugin/registrar.h"
#include "proxy/kubelet_side/kubelet_side.h"
#include "proxy/translate/translate.h"
#include "proxy/util/dir_watcher.h"
#include "proxy/util/work_queue.h"

namespace dpproxy {

class DevicePluginSide : public KubeletSide {
 public:
  struct Parts {
    EventLog* events = nullptr;
    LossCounter* losses = nullptr;
    Telemetry* telemetry = nullptr;
    // Registrations run here, never on the housekeeping thread (a 1.25+
    // kubelet dials back for up to 10 s). Shut down after Stop(), before
    // this side is destroyed.
    WorkQueue* workers = nullptr;
    // Runs housekeeping again soon (a registration ended, a file changed).
    std::function<void()> wake;
  };
  // `kubelet.socket_generation` names the sockets: the other one than a
  // takeover's predecessor's.
  DevicePluginSide(KubeletSideOptions kubelet, Parts parts);
  ~DevicePluginSide() override;

  absl::Status Start() override;
  void Stop(Ending ending) override;
  void AddResource(Allocator* allocator) override;
  // Its endpoint stops: the socket goes, the kubelet's stream ends, and the
  // kubelet counts its devices unhealthy (allocatable 0) while its pods run
  // on. Kept until the side goes (calls in flight may still use it).
  void RemoveResource(const std::string& resource) override;
  void Withdraw(Allocator* allocator) override;
  std::vector<std::string> Withdrawn() override;
  void Wake() override {}
  PassResult Pass(absl::Time now) override;
  void SetCallSettings(absl::Duration backend_timeout, bool cdi_annotations) override;
  KubeletView ViewOf(const std::string& resource) override;
  std::vector<HealthCheck> Readiness() override;
  std::vector<KubeletGate*> Gates() override;
  void Hold() override { registrar_.Hold(); }
  void Resume(bool successor_registered) override {
    registrar_.Resume(successor_registered);
  }
  // Called before each registration is sent to the kubelet.
  void SetBeforeRegisterHook(std::function<void()> hook) {
    registrar_.SetBeforeRegisterHook(std::move(hook));
  }
  // Called when a removed socket has just been served again (Registrar).
  void SetAfterServedAgainHook(std::function<void()> hook) {
    registrar_.SetAfterServedAgainHook(std::move(hook));
  }
  void BeforePredecessorExits() override;

 private:
  std::vector<DevicePluginServer*> Endpoints();
  // Handed over: the calls the kubelet sent here just before it moved to
  // the successor are answered before the sockets close.
  void DrainAfterHandoff();

  const KubeletSideOptions kubelet_;
  const Parts parts_;
  Registrar registrar_;
  std::unique_ptr<DirWatcher> watcher_;

  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<DevicePluginServer>> endpoints_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<DevicePluginServer>> removed_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> withdrawn_ ABSL_GUARDED_BY(mu_);
  // As the last SIGHUP left them.
  absl::Duration backend_timeout_ ABSL_GUARDED_BY(mu_);
  bool cdi_annotations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_DEVICE_PLUGIN_SIDE_H_
