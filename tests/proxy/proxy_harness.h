// File: proxy_harness.h
//
// A simulated kubelet, dpproxy and sample plugins in one process, each on its
// own real Unix sockets under a short temporary directory.
#ifndef DPPROXY_TESTS_PROXY_PROXY_HARNESS_H_
#define DPPROXY_TESTS_PROXY_PROXY_HARNESS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "prometheus/text_serializer.h"
#include "proxy/server/metrics.h"
#include "proxy/server/proxy_server.h"
#include "tests/testing/changes.h"
#include "tests/testing/sim_helpers.h"
#include "tests/testing/temp_dir.h"
#include "tools/kubelet_sim/kubelet_sim.h"
#include "tools/sample_plugin/sample_plugin.h"

namespace dpproxy::testing {

inline constexpr absl::Duration kWait = absl::Seconds(10);

class ProxyHarness {
 public:
  // `watcher`: the proxy registers through the plugin watcher.
  ProxyHarness(sim::Personality personality, bool watcher,
               std::function<void(ProxyConfig&)> tweak = nullptr,
               std::function<void(sim::KubeletSimOptions&)> sim_tweak = nullptr) {
    sim::KubeletSimOptions so;
    so.root_dir = dir_.Sub("k");
    so.personality = personality;
    if (sim_tweak) sim_tweak(so);
    sim_ = std::make_unique<sim::KubeletSim>(so);
    changes_.Watch(sim_->events());
    config_.kubelet.kubelet_root = dir_.Sub("k");
    config_.plugin_dir = dir_.Sub("p");
    config_.kubelet.registration =
        watcher ? KubeletRegistration::kPluginWatcher : KubeletRegistration::kKubeletSocket;
    config_.kubelet.backend_timeout = absl::Seconds(5);
    config_.state_dir = dir_.Sub("state");
    config_.dial_timeout = absl::Seconds(5);
    // Tests of the window after a kubelet start set it themselves.
    config_.reconcile_start_grace = absl::ZeroDuration();
    // The node's container runtime, as a real node has one.
    config_.container_runtime_endpoint = sim_->container_runtime_socket();
    if (tweak) tweak(config_);
    NewProxy(config_);
  }
  ~ProxyHarness() {
    plugins_.clear();
    proxy_.reset();
    sim_.reset();
  }

  sim::KubeletSim& sim() { return *sim_; }
  ProxyServer& proxy() { return *proxy_; }
  // One scrape of the metrics dpproxy serves, as Prometheus text.
  // What /metrics serves: the families derived from the status and those
  // updated as things happen.
  std::string MetricsText() {
    return ProxyMetrics([this] { return proxy_->Status(/*with_devices=*/false); },
                        &proxy_->events())
               .Text() +
           prometheus::TextSerializer().Serialize(proxy_->telemetry().registry()->Collect());
  }
  const ProxyConfig& config() const { return config_; }
  std::string dir(const std::string& sub) const { return dir_.Sub(sub); }

  // Restarts the proxy process (a new ProxyServer on the same directories),
  // optionally with changed configuration.
  void RestartProxy(std::function<void(ProxyConfig&)> tweak = nullptr) {
    proxy_.reset();
    if (tweak) tweak(config_);
    NewProxy(config_);
  }
  void StopProxy() { proxy_->Shutdown(); }

  // A new dpproxy on the same directories takes over from the running one
  // (--takeover), and the old one stops once it has handed over, as its
  // main does: an upgrade beside the running one. The new one's Start()
  // returns after the old one released the state; the old one is told to
  // finish once the new one is registered.
  // `meanwhile` runs once the new one took the state, before it is
  // registered (a kubelet restart in the middle of it); `tweak` changes
  // the configuration the new one (and later restarts) run with.
  absl::Status TakeOver(const std::function<void()>& meanwhile = nullptr,
                        const std::function<void(ProxyConfig&)>& tweak = nullptr) {
    if (tweak) tweak(config_);
    ProxyConfig c = config_;
    c.takeover = true;
    auto next = std::make_unique<ProxyServer>(c);
    changes_.Watch(next->events());
    next->SetHousekeepingHook(changes_.Notifier());
    if (absl::Status s = next->Start(); !s.ok()) return s;
    if (meanwhile) meanwhile();
    if (!next->WaitForTakeover(kWait)) {
      return absl::DeadlineExceededError("the takeover did not complete");
    }
    if (!proxy_->handed_over()) {
      return absl::InternalError("the takeover completed, the old dpproxy never finished");
    }
    proxy_->Shutdown();
    proxy_ = std::move(next);
    return absl::OkStatus();
  }

  sample::SamplePluginOptions PluginOptions(ApiVersion api) const {
    sample::SamplePluginOptions o;
    o.api = api;
    o.resource = "vendor.com/gpu";
    o.devices = 4;
    o.id_pattern = "gpu-{i}";
    o.kubelet_socket = dir_.Sub("p") + "/kubelet.sock";
    return o;
  }

  sample::SamplePlugin* StartPlugin(const sample::SamplePluginOptions& o) {
    plugins_.push_back(std::make_unique<sample::SamplePlugin>(o));
    changes_.Watch(plugins_.back()->events());
    if (!plugins_.back()->Start().ok()) return nullptr;
    return plugins_.back().get();
  }
  void StopPlugins() { plugins_.clear(); }

  // Never from a temporary State: the pointer would dangle.
  const sim::ResourceState* Resource(sim::State&& st, const std::string& name) = delete;
  const sim::ResourceState* Resource(const sim::State& st, const std::string& name) {
    return FindResource(st, name);
  }

  // Waits until `pred` holds, looking again at each event of the kubelet,
  // dpproxy, the plugins and whatever else was watched (Watch).
  bool WaitFor(const std::function<bool()>& pred, absl::Duration timeout = kWait) {
    return changes_.WaitUntil(pred, timeout);
  }
  // Wakes WaitFor at each event of `log` too (an API server, say).
  void Watch(EventLog& log) { changes_.Watch(log); }

  // Health of one device as the kubelet sees it ("" if unknown).
  std::string KubeletHealth(const std::string& resource, const std::string& id) {
    return testing::KubeletHealth(*sim_, resource, id);
  }

 private:
  // Its events wake WaitFor, and so does the end of each housekeeping pass:
  // what a pass changes (a hold's expiry, the saved status) may come with no
  // event.
  void NewProxy(const ProxyConfig& c) {
    proxy_ = std::make_unique<ProxyServer>(c);
    changes_.Watch(proxy_->events());
    proxy_->SetHousekeepingHook(changes_.Notifier());
  }

  Changes changes_;
  ShortTempDir dir_;
  ProxyConfig config_;
  std::unique_ptr<sim::KubeletSim> sim_;
  std::unique_ptr<ProxyServer> proxy_;
  std::vector<std::unique_ptr<sample::SamplePlugin>> plugins_;
};

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_PROXY_PROXY_HARNESS_H_
