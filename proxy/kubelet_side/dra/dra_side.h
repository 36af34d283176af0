// File: dra_side.h
//
// dpproxy toward a kubelet that speaks DRA (kubelet.api: dra; docs/dra.md):
// every resource dpproxy serves is published as a ResourceSlice pool of its
// own (slice_publisher.h), claims are prepared through its device plugin
// (claim_preparer.h), and the kubelet finds the driver through its plugin
// watcher (dra_server.h), which also carries the devices' health.
//
// One thread publishes: on a change (Wake) or once a second, the pools
// whose resource changed; every 30 s, and twice after a kubelet registered
// the driver (its start deletes the node's slices), all of them. A pool
// that fails waits 1 s, doubling to 1 min, before it is tried again.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DRA_DRA_SIDE_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DRA_DRA_SIDE_H_

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/config/proxy_config.h"
#include "proxy/core/allocator.h"
#include "proxy/core/resource.h"
#include "proxy/kubelet_side/dra/claim_preparer.h"
#include "proxy/kubelet_side/dra/dra_server.h"
#include "proxy/kubelet_side/dra/move_fence.h"
#include "proxy/kubelet_side/dra/slice_publisher.h"
#include "proxy/events/event_log.h"
#include "proxy/kube/kube_client.h"
#include "proxy/kubelet_side/kubelet_side.h"
#include "proxy/translate/translate.h"

namespace dpproxy {

class DraSide : public KubeletSide {
 public:
  struct Options {
    DraOptions dra;
    std::string kubelet_root;
    // Prepared claims are journaled here (nullptr: kept in memory only);
    // files of claims under <state_dir>/dra-claims are moved into it.
    std::string state_dir;
    ClaimJournal* journal = nullptr;
    absl::Duration backend_timeout = absl::Seconds(30);
    int64_t api_max_body_bytes = 16 << 20;
    // Names the kubelet-facing sockets (dra_server.h): the other one than
    // a takeover's predecessor's.
    int socket_generation = 0;
    // The devices of a resource cordoned by hand, with their reasons: the
    // health stream says "cordoned: REASON" for them. May be empty.
    std::function<std::map<std::string, std::string>(const std::string& resource)> cordons_of;
  };
  // The resources dpproxy serves now, each through its allocator (any
  // thread; they outlive this).
  using Resources = std::function<std::vector<Allocator*>()>;

  DraSide(Options options, Resources resources, EventLog* events, LossCounter* losses);
  ~DraSide() override;

  DraSide(const DraSide&) = delete;
  DraSide& operator=(const DraSide&) = delete;

  // Connects to the API server (one that does not answer yet is waited
  // for; one that answers but cannot serve is an error), writes again the
  // CDI specs a reboot removed, serves the kubelet and starts publishing.
  absl::Status Start() override;
  void Stop(Ending ending) override;
  // Ends the API calls in flight within a second and fails later ones at
  // once: a dpproxy stopping (SIGTERM) while a call waits on a slow API
  // server, Start's included. Thread-safe, from any thread, at any time.
  void CancelApiCalls();
  // The resources callback lists it from now on: publish soon.
  void AddResource(Allocator* allocator) override;
  // The resources callback lists it no more: its pool is removed soon.
  void RemoveResource(const std::string& resource) override { Wake(); }
  // A resource changed: publish soon.
  void Wake() override;
  // The publishing loop has a thread of its own.
  PassResult Pass(absl::Time) override { return PassResult(); }
  // The limit of each call to a plugin, from the next on; CDI names are
  // the answer itself here, never annotations.
  void SetCallSettings(absl::Duration backend_timeout, bool cdi_annotations) override;
  // "dra (DRIVER)" once the kubelet registered the driver; no socket of
  // its own.
  KubeletView ViewOf(const std::string& resource) override;
  // "dra-registered" and "dra-api-server".
  std::vector<HealthCheck> Readiness() override;
  // The DRA service socket.
  std::vector<KubeletGate*> Gates() override;
  // Released to a successor: publishes nothing more (it does).
  void Hold() override;
  void Resume(bool successor_registered) override;
  // Nothing: the predecessor's registration socket goes without a
  // deletion the kubelet acts on (DraServer::Stop).
  void BeforePredecessorExits() override {}

  // What status and readiness report.
  bool registered();  // the kubelet registered the driver
  std::string registration_socket();
  std::string api_version();  // "resource.k8s.io/v1", ...
  // Why the API server last failed dpproxy; "" once it answered.
  std::string api_error();
  int prepared_claims();

  // The fence a resource leaving the device manager for DRA goes through
  // (move_fence.h), stepped on this side's thread; nullptr when
  // dra.move_fence is off.
  MoveFence* move_fence() { return fence_.get(); }

 private:
  std::optional<BridgedResource> ResourceOfPool(const std::string& pool);
  // The health stream's view of one resource's devices (`flapping`: held
  // Unhealthy by the flap damper).
  void PublishHealth(const std::string& resource, const Resource::Snapshot& snap,
                     bool connected, const std::set<std::string>& flapping);
  // The publishing thread: each pass publishes the pools that changed, and
  // every 30 s all of them (the publisher writes nothing when the API
  // server already agrees, and repairs what a kubelet start deleted).
  void Loop();
  // The loop thread's own record.
  struct LoopState {
    // What each resource's pool was last published from (its change count).
    std::map<std::string, uint64_t> published;
    std::map<std::string, uint64_t> health_sent;  // the same, for the health stream
    // A pool that failed to publish waits before the next try, 1 s
    // doubling to 1 min, and its error is logged when it first appears or
    // changes.
    struct Retry {
      absl::Time next = absl::InfinitePast();
      absl::Duration backoff = absl::ZeroDuration();
      std::string error;
    };
    std::map<std::string, Retry> retry;
    absl::Time full_at = absl::InfinitePast();
    bool waiting_logged = false;  // for the registration, logged once
    absl::Time full_again_at = absl::InfiniteFuture();  // after a kubelet registered us
  };
  // Until woken or a second has passed: false once stopping. `registered`:
  // a kubelet registered the driver since; `held`: a successor holds the
  // node.
  bool WaitForPass(bool* registered, bool* held);
  // The pools of resources no longer served through DRA are removed.
  void RemoveUnservedPools(LoopState* st, const std::vector<Allocator*>& serving);
  // One resource's health stream and pool, if it changed (or `full`).
  void PublishPool(LoopState* st, Resource* res, bool full, bool held);
  static std::vector<SliceDevice> SliceDevicesOf(const Resource::Snapshot& snap,
                                                 bool connected);
  void SetApiError(std::string why);
  // Reads the kubelet's version from this node's status (get on nodes);
  // kubelet_minor_ stays as it was if the API server does not say.
  void LearnKubeletVersion();
  // How the registration goes at a hand-over, for the kubelet's release.
  DraServer::Withdrawal WithdrawalForKubelet();

  const Options options_;
  const Resources resources_;
  EventLog* const events_;
  LossCounter* const losses_;
  std::unique_ptr<KubeClient> kube_;
  // CancelApiCalls: asked, and the client to tell (kube_ once made).
  std::atomic<bool> api_cancelled_{false};
  std::atomic<KubeClient*> kube_live_{nullptr};
  std::unique_ptr<SlicePublisher> publisher_;
  std::unique_ptr<ClaimPreparer> preparer_;
  std::unique_ptr<DraServer> server_;
  std::unique_ptr<MoveFence> fence_;
  std::thread thread_;
  // The kubelet's minor version (status.nodeInfo.kubeletVersion); 0 until
  // known. Read when the loop starts and whenever the kubelet registers
  // the driver again (it may have been upgraded).
  std::atomic<int> kubelet_minor_{0};
  std::string kubelet_version_error_;  // the loop's thread only

  absl::Mutex mu_;
  std::string api_error_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool full_ ABSL_GUARDED_BY(mu_) = false;  // publish every pool, not only changed ones
  bool held_ ABSL_GUARDED_BY(mu_) = false;  // Hold(): a successor publishes
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // Stop() ran
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DRA_DRA_SIDE_H_
