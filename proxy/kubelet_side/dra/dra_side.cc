#include "proxy/kubelet_side/dra/dra_side.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/kubelet_side/dra/device_names.h"
#include "proxy/kubelet_side/dra/resource_slices.h"
#include "proxy/kube/kube_config.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/util/files.h"
#include "proxy/util/thread_name.h"

namespace dpproxy {

DraSide::DraSide(Options options, Resources resources, EventLog* events, LossCounter* losses)
    : options_(std::move(options)),
      resources_(std::move(resources)),
      events_(events),
      losses_(losses) {
  if (options_.dra.move_fence) {
    fence_ = std::make_unique<MoveFence>(options_.dra.node_name, events_);
  }
}

DraSide::~DraSide() { Stop(Ending::kForGood); }

void DraSide::CancelApiCalls() {
  api_cancelled_.store(true);
  if (KubeClient* k = kube_live_.load(); k != nullptr) k->Cancel();
}

void DraSide::Stop(Ending ending) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;  // the first one says how (the destructor's does not)
    stopped_ = true;
    stop_ = true;
  }
  // A call waiting on a slow API server would hold the stop for its whole
  // deadline.
  CancelApiCalls();
  if (thread_.joinable()) thread_.join();
  if (fence_ != nullptr && kube_ != nullptr) {
    // The taint of a move under way goes, through a client of its own (the
    // side's calls are cancelled), within a few seconds at most.
    absl::StatusOr<std::unique_ptr<KubeClient>> last =
        KubeClient::Create(kube_->config(), absl::Seconds(5));
    fence_->Stop(last.ok() ? last->get() : nullptr);
  }
  if (server_) {
    const bool handed_over = ending == Ending::kHandedOver;
    server_->Stop(handed_over, handed_over ? WithdrawalForKubelet() : DraServer::Withdrawal::kDelete);
  }
}

DraServer::Withdrawal DraSide::WithdrawalForKubelet() {
  const int minor = kubelet_minor_.load();
  if (minor >= 33) return DraServer::Withdrawal::kDelete;
  if (minor == 0) {
    // A deletion on 1.32 would take the successor's registration with it;
    // a rename on 1.33+ leaves this instance registered, dead, until the
    // kubelet restarts. The lesser harm.
    LOG(WARNING) << "DRA driver " << options_.dra.driver
                 << ": the kubelet's version is not known (" << kubelet_version_error_
                 << "); this instance's registration is renamed away, which a 1.33+ kubelet "
                    "does not notice: it keeps this instance registered until it restarts. "
                    "Grant dpproxy get on nodes (deploy/dra-rbac.yaml)";
  }
  return DraServer::Withdrawal::kRename;
}

void DraSide::LearnKubeletVersion() {
  absl::StatusOr<KubeClient::Json> node =
      kube_->Get(absl::StrCat("/api/v1/nodes/", options_.dra.node_name));
  std::string version;
  if (node.ok()) {
    const KubeClient::Json* at = &*node;
    for (const char* key : {"status", "nodeInfo", "kubeletVersion"}) {
      auto it = at->is_object() ? at->find(key) : at->end();
      at = it == at->end() ? nullptr : &*it;
      if (at == nullptr) break;
    }
    if (at != nullptr && at->is_string()) version = at->get<std::string>();
  }
  int major = 0, minor = 0;
  if (version.empty() || std::sscanf(version.c_str(), "v%d.%d", &major, &minor) != 2 ||
      major != 1 || minor <= 0) {
    kubelet_version_error_ =
        !node.ok() ? absl::StrCat("cannot read node ", options_.dra.node_name, ": ",
                                  node.status().message())
                   : absl::StrCat("node ", options_.dra.node_name,
                                  " reports no kubelet version of the form v1.N (",
                                  GoQuote(version), ")");
    return;
  }
  kubelet_version_error_.clear();
  if (kubelet_minor_.exchange(minor) != minor) {
    LOG(INFO) << "DRA: the kubelet of node " << options_.dra.node_name << " is " << version;
    events_->Emit("dra_kubelet_version", {{"node", options_.dra.node_name}, {"version", version}});
  }
}

std::vector<KubeletGate*> DraSide::Gates() {
  if (server_ == nullptr) return {};
  return {server_.get()};
}

void DraSide::Hold() {
  absl::MutexLock lock(&mu_);
  held_ = true;
}

void DraSide::Resume(bool /*successor_registered*/) {
  absl::MutexLock lock(&mu_);
  held_ = false;
  full_ = true;
  wake_ = true;
}


void DraSide::AddResource(Allocator* allocator) {
  LOG(INFO) << "resource " << allocator->resource()->name() << ": published as DRA devices of "
            << "driver " << options_.dra.driver;
  Wake();
}

void DraSide::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

void DraSide::SetCallSettings(absl::Duration backend_timeout, bool) {
  if (preparer_) preparer_->SetBackendTimeout(backend_timeout);
}

KubeletView DraSide::ViewOf(const std::string&) {
  KubeletView v;
  if (registered()) v.api = absl::StrCat("dra (", options_.dra.driver, ")");
  return v;
}

std::vector<HealthCheck> DraSide::Readiness() {
  HealthCheck c;
  c.name = "dra-registered";
  c.ok = registered();
  if (!c.ok) {
    c.reason = absl::StrCat("the kubelet has not registered DRA driver ", options_.dra.driver,
                            " (its plugin watcher reads ", registration_socket(), ")");
  }
  HealthCheck api;
  api.name = "dra-api-server";
  api.reason = api_error();
  api.ok = api.reason.empty();
  return {std::move(c), std::move(api)};
}

bool DraSide::registered() { return server_ != nullptr && server_->registered(); }

std::string DraSide::registration_socket() {
  return server_ != nullptr ? server_->registration_socket() : std::string();
}

std::string DraSide::api_version() {
  return publisher_ != nullptr ? publisher_->api_version() : std::string();
}

std::string DraSide::api_error() {
  absl::MutexLock lock(&mu_);
  return api_error_;
}

int DraSide::prepared_claims() { return preparer_ != nullptr ? preparer_->prepared_claims() : 0; }

void DraSide::SetApiError(std::string why) {
  absl::MutexLock lock(&mu_);
  api_error_ = std::move(why);
}

absl::Status DraSide::Start() {
  absl::StatusOr<KubeConfig> kc = options_.dra.kubeconfig.empty()
                                      ? InClusterConfig()
                                      : LoadKubeconfig(options_.dra.kubeconfig);
  if (!kc.ok()) return kc.status();
  absl::StatusOr<std::unique_ptr<KubeClient>> client = KubeClient::Create(*kc);
  if (!client.ok()) return client.status();
  kube_ = *std::move(client);
  kube_->set_max_body_bytes(static_cast<size_t>(options_.api_max_body_bytes));
  kube_live_.store(kube_.get());
  if (api_cancelled_.load()) kube_->Cancel();
  if (fence_ != nullptr) fence_->set_client(kube_.get());
  publisher_ = std::make_unique<SlicePublisher>(kube_.get(), options_.dra.driver,
                                                options_.dra.node_name);
  // An API server that does not answer yet (a node booting before the
  // control plane, a network blip) is waited for: the loop publishes once
  // it answers, and a prepare meanwhile fails its claim, which the kubelet
  // retries. One it answers for but cannot serve is a start error.
  if (absl::Status s = publisher_->Discover(); !s.ok()) {
    const std::string why =
        absl::StrCat("the API server (", kc->source, ") does not answer: ", s.message());
    if (s.code() != absl::StatusCode::kUnavailable &&
        s.code() != absl::StatusCode::kDeadlineExceeded &&
        s.code() != absl::StatusCode::kResourceExhausted) {
      return absl::Status(s.code(), absl::StrCat("DRA mode needs the API server (", kc->source,
                                                 "): ", s.message()));
    }
    LOG(WARNING) << "DRA: " << why << "; retrying (1 s doubling to 1 min)";
    events_->Emit("dra_api_unreachable", {{"error", std::string(s.message())}});
    SetApiError(why);
  }
  ClaimPreparer::Options o;
  o.driver = options_.dra.driver;
  o.node = options_.dra.node_name;
  o.api_version = [this] { return publisher_->Version(); };
  o.cdi_dir = options_.dra.cdi_dir;
  o.journal = options_.journal;
  o.claim_files_dir =
      options_.state_dir.empty() ? "" : JoinPath(options_.state_dir, "dra-claims");
  o.backend_timeout = options_.backend_timeout;
  o.on_loss = [this](const std::string& resource, const Loss& loss) {
    for (const std::string& kind : losses_->Add(resource, loss)) {
      LOG(WARNING) << "resource " << resource << " in DRA mode: " << DraLossReason(kind)
                   << " (logged once per resource, counted as lossy translation " << kind << ")";
      events_->Emit("lossy_translation",
                   {{"resource", resource}, {"kind", kind}, {"kubelet_api", "dra"}});
    }
  };
  preparer_ = std::make_unique<ClaimPreparer>(
      o, kube_.get(), [this](const std::string& pool) { return ResourceOfPool(pool); });
  absl::StatusOr<int> migrated = preparer_->MigrateClaimFiles();
  if (!migrated.ok()) return migrated.status();
  if (*migrated > 0) {
    LOG(INFO) << "DRA: " << *migrated << " prepared claim(s) moved from " << o.claim_files_dir
              << " into the journal";
    events_->Emit("dra_claims_migrated", {{"claims", *migrated}});
  }
  absl::StatusOr<int> restored = preparer_->RestoreSpecs();
  if (!restored.ok()) return restored.status();
  if (*restored > 0) {
    LOG(INFO) << "DRA: wrote again the CDI specs of " << *restored
              << " prepared claim(s) whose specs were gone (a reboot empties " << o.cdi_dir << ")";
    events_->Emit("dra_specs_restored", {{"claims", *restored}});
  }
  // A kubelet that registers the driver has just started and deletes the
  // node's slices then: publish everything again at once, and once more a
  // little later, as its deletion may land after its registration call.
  auto on_registered = [this] {
    absl::MutexLock lock(&mu_);
    full_ = true;
    wake_ = true;
  };
  server_ = std::make_unique<DraServer>(
      DraServer::Options{options_.kubelet_root, options_.dra.driver, on_registered,
                         options_.socket_generation},
      preparer_.get(), events_);
  if (absl::Status s = server_->Start(); !s.ok()) return s;
  LOG(INFO) << "DRA mode: driver " << options_.dra.driver << " on node " << options_.dra.node_name
            << ", " << publisher_->api_version() << " at " << kc->server;
  thread_ = std::thread([this] {
    NameThisThread("dpp-dra");
    Loop();
  });
  return absl::OkStatus();
}

std::optional<BridgedResource> DraSide::ResourceOfPool(const std::string& pool) {
  for (Allocator* alloc : resources_()) {
    Resource* res = alloc->resource();
    const std::string name = res->name();
    if (PoolName(PoolSpec{options_.dra.driver, options_.dra.node_name, name}) != pool) continue;
    BridgedResource r;
    r.resource = name;
    r.backend = res->backend_connected() ? res->backend() : nullptr;
    r.allocator = alloc;
    const Resource::Snapshot snap = res->Current();
    for (int i = 0; i < snap.list->size(); ++i) {
      r.device_ids.emplace_back(snap.list->device(i).id);
    }
    return r;
  }
  return std::nullopt;
}

void DraSide::PublishHealth(const std::string& resource, const Resource::Snapshot& snap,
                            bool connected, const std::set<std::string>& flapping) {
  std::vector<DeviceHealthEntry> health;
  health.reserve(static_cast<size_t>(snap.list->size()));
  const std::map<std::string, std::string> cordoned =
      options_.cordons_of ? options_.cordons_of(resource) : std::map<std::string, std::string>();
  for (int i = 0; i < snap.list->size(); ++i) {
    const DeviceList::View d = snap.list->device(i);
    DeviceHealthEntry h;
    h.device = DraDeviceName(d.id);
    if (auto c = cordoned.find(std::string(d.id)); c != cordoned.end()) {
      h.health = DeviceHealthEntry::Health::kUnhealthy;
      h.message = absl::StrCat("cordoned: ", c->second);
    } else if (flapping.count(std::string(d.id)) > 0) {
      h.health = DeviceHealthEntry::Health::kUnhealthy;
      h.message = "flapping: held Unhealthy until its health stays put (flap_damping)";
    } else if (!connected) {
      h.health = DeviceHealthEntry::Health::kUnknown;
      h.message = absl::StrCat("no device plugin is connected for ", resource);
    } else if (d.health == kHealthy) {
      h.health = DeviceHealthEntry::Health::kHealthy;
    } else {
      h.health = DeviceHealthEntry::Health::kUnhealthy;
      h.message = absl::StrCat("the device plugin of ", resource, " reports ", d.id, " ", d.health);
    }
    health.push_back(std::move(h));
  }
  server_->health().SetPool(
      PoolName(PoolSpec{options_.dra.driver, options_.dra.node_name, resource}), health);
}

bool DraSide::WaitForPass(bool* registered, bool* held) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wake_ || stop_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
  if (stop_) return false;
  wake_ = false;
  *held = held_;
  *registered = full_ && !held_;
  if (!held_) full_ = false;
  return true;
}

void DraSide::RemoveUnservedPools(LoopState* st, const std::vector<Allocator*>& serving) {
  std::set<std::string> names;
  for (Allocator* alloc : serving) names.insert(alloc->resource()->name());
  for (auto it = st->published.begin(); it != st->published.end();) {
    if (names.count(it->first) > 0) {
      ++it;
      continue;
    }
    if (absl::Status s = publisher_->Unpublish(it->first); !s.ok()) {
      LOG(WARNING) << "DRA: cannot remove the pool of " << it->first
                   << ", no longer served through DRA (retried): " << s.message();
      ++it;
      continue;
    }
    LOG(INFO) << "DRA: " << it->first << " is no longer served through DRA; its pool is "
              << "removed";
    events_->Emit("dra_pool_removed", {{"resource", it->first}});
    st->retry.erase(it->first);
    it = st->published.erase(it);
  }
}

std::vector<SliceDevice> DraSide::SliceDevicesOf(const Resource::Snapshot& snap, bool connected) {
  std::vector<SliceDevice> devices;
  devices.reserve(static_cast<size_t>(snap.list->size()));
  for (int i = 0; i < snap.list->size(); ++i) {
    const DeviceList::View d = snap.list->device(i);
    SliceDevice sd;
    sd.id = std::string(d.id);
    // A device a pod of the extended resource holds is not offered
    // (Resource::SetHeldAcrossPaths).
    sd.healthy = d.health == kHealthy && connected && snap.left_out_of_pool->count(sd.id) == 0;
    if (d.has_topology) {
      v1beta1::TopologyInfo t;
      if (t.ParseFromArray(d.topology.data(), static_cast<int>(d.topology.size()))) {
        for (const auto& n : t.nodes()) sd.numa_nodes.push_back(n.id());
      }
    }
    devices.push_back(std::move(sd));
  }
  return devices;
}

void DraSide::PublishPool(LoopState* st, Resource* res, bool full, bool held) {
  const std::string name = res->name();
  const uint64_t changes = res->changes();
  auto it = st->published.find(name);
  if (!full && it != st->published.end() && it->second == changes) return;
  const Resource::Snapshot snap = res->Current();
  const bool connected = res->backend_connected();
  // The health stream first, once per change: it needs no API server,
  // and a pool waiting out an API backoff is not recomputed each pass.
  auto sent = st->health_sent.find(name);
  if (sent == st->health_sent.end() || sent->second != changes) {
    PublishHealth(name, snap, connected, res->damped());
    st->health_sent[name] = changes;
  }
  if (held) return;  // the successor publishes
  // Not before the kubelet has registered the driver: the scheduler
  // places claims on the node as soon as its slices appear, and the
  // kubelet fails the prepare of a driver it has not registered yet
  // (its plugin watcher registers up to a second after the socket
  // appears), retrying only at the pod's next resync, about a minute
  // later. on_registered publishes everything at once.
  if (!server_->registered()) {
    if (!st->waiting_logged) {
      LOG(INFO) << "DRA: the devices are published once the kubelet has registered driver "
                << options_.dra.driver;
      st->waiting_logged = true;
    }
    return;
  }
  LoopState::Retry& r = st->retry[name];
  if (absl::Now() < r.next) return;
  const std::vector<SliceDevice> devices = SliceDevicesOf(snap, connected);
  const int writes = publisher_->writes();
  absl::Status s = publisher_->Publish(name, devices);
  if (!s.ok()) {
    r.backoff = std::min(absl::Minutes(1), std::max(absl::Seconds(1), r.backoff * 2));
    r.next = absl::Now() + r.backoff;
    if (std::string(s.message()) != r.error) {
      r.error = std::string(s.message());
      LOG(WARNING) << "DRA: cannot publish " << name << "'s devices (retried, "
                   << "up to every minute): " << s.message();
    }
    events_->Emit("dra_publish_failed", {{"resource", name}, {"error", r.error}});
    SetApiError(absl::StrCat("cannot publish ", name, "'s devices: ", r.error));
    return;
  }
  if (!r.error.empty()) LOG(INFO) << "DRA: " << name << "'s devices published again";
  SetApiError("");
  r = LoopState::Retry();
  st->published[name] = changes;
  if (publisher_->writes() != writes) {
    events_->Emit("dra_pool_published", {{"resource", name}, {"devices", devices.size()}});
  }
}

void DraSide::Loop() {
  LoopState st;
  for (;;) {
    bool registered = false;
    bool held = false;
    if (!WaitForPass(&registered, &held)) return;
    const absl::Time now = absl::Now();
    if (registered) st.full_again_at = now + absl::Seconds(5);
    const bool again = now >= st.full_again_at;
    if (again) st.full_again_at = absl::InfiniteFuture();
    const bool full = registered || again || now - st.full_at >= absl::Seconds(30);
    if (full) st.full_at = now;
    // At the first pass, each time the kubelet registers the driver (it
    // may have been upgraded), and every 30 s while it is not known.
    if (registered || (full && kubelet_minor_.load() == 0)) LearnKubeletVersion();
    const std::vector<Allocator*> serving = resources_();
    // A resource no longer served through DRA (its path changed): its pool
    // goes, so that no claim is allocated from it.
    if (!held) RemoveUnservedPools(&st, serving);
    for (Allocator* alloc : serving) PublishPool(&st, alloc->resource(), full, held);
    // A resource leaving the device manager (move_fence.h); a successor
    // that took the node over fences its own moves.
    if (fence_ != nullptr && !held) fence_->Step(absl::Now());
  }
}

}  // namespace dpproxy
