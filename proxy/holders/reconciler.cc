#include "proxy/holders/reconciler.h"

#include <grpcpp/client_context.h>
#include <glog/logging.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "proto/cri/api.grpc.pb.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/thread_name.h"

namespace dpproxy {
namespace {

// The shortest time between two reads of a kubelet checkpoint that keeps
// changing (CheckCheckpoint).
constexpr absl::Duration kCheckpointReadGap = absl::Milliseconds(250);

}  // namespace

state::State Reconciler::DevicePluginAllocations() const {
  state::State st = keeper_->AllocationsSnapshot();
  auto* all = st.mutable_allocations();
  if (std::none_of(all->begin(), all->end(),
                   [](const state::Allocation& a) { return a.has_claim(); })) {
    return st;
  }
  google::protobuf::RepeatedPtrField<state::Allocation> taken;
  taken.Swap(all);
  for (state::Allocation& a : taken) {
    if (!a.has_claim()) *all->Add() = std::move(a);
  }
  return st;
}

Reconciler::Reconciler(Options options, StateKeeper* keeper, EventLog* events,
                       std::function<void()> changed)
    : options_(std::move(options)), keeper_(keeper), events_(events),
      changed_(std::move(changed)),
      forgotten_({options_.kubelet, options_.grace, options_.restart_grace,
                  options_.container_runtime_socket},
                 keeper, events, changed_) {}

Reconciler::~Reconciler() { Stop(); }

void Reconciler::Start() {
  if (options_.interval <= absl::ZeroDuration() || thread_.joinable()) return;
  {
    absl::MutexLock lock(&stop_mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] {
    NameThisThread("dpp-reconcile");
    Loop();
  });
}

void Reconciler::Stop() {
  {
    absl::MutexLock lock(&stop_mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::string Reconciler::PodResourcesSocket() const {
  return KubeletPodResourcesSocket(options_.kubelet);
}

std::string Reconciler::CheckpointPath() const {
  return JoinPath(DevicePluginDir(options_.kubelet), kKubeletCheckpointName);
}

void Reconciler::Nudge() {
  absl::MutexLock lock(&stop_mu_);
  nudged_ = true;
}

void Reconciler::Loop() {
  // First pass soon after start (the kubelet may be starting too), then
  // every interval, sooner when nudged while someone waits.
  absl::Time next = absl::Now() + std::min(absl::Seconds(10), options_.interval);
  for (;;) {
    bool nudged = false;
    {
      absl::MutexLock lock(&stop_mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(stop_mu_) -> bool {
        return stop_ || nudged_;
      };
      stop_mu_.AwaitWithDeadline(absl::Condition(&woken), next);
      if (stop_) return;
      nudged = nudged_;
      nudged_ = false;
    }
    const absl::Time now = absl::Now();
    if (now < next) {
      // Nudged: `hurry` is asked here, with no lock of the caller's held.
      if (nudged && options_.hurry && options_.hurry()) {
        next = std::min(next, now + options_.nudge_delay);
      }
      continue;
    }
    absl::Status s = ReconcileOnce();
    if (!s.ok()) VLOG(1) << "reconciliation skipped: " << s.message();
    absl::Duration wait = options_.interval;
    if (options_.hurry && options_.hurry()) wait = std::min(wait, options_.hurried_interval);
    next = absl::Now() + wait;
  }
}

absl::StatusOr<v1::ListPodResourcesResponse> Reconciler::ListPodResources() const {
  const std::string socket = PodResourcesSocket();
  if (!PathExists(socket)) {
    return absl::UnavailableError(absl::StrCat("no pod-resources API at ", socket));
  }
  auto stub = v1::PodResourcesLister::NewStub(MakeUnixChannel(socket));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::ListPodResourcesResponse list;
  grpc::Status st = stub->List(&ctx, v1::ListPodResourcesRequest(), &list);
  if (!st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("pod-resources List failed: ", DescribeGrpcStatus(st)));
  }
  return list;
}

void Reconciler::LearnFromList(const v1::ListPodResourcesResponse& list) {
  std::vector<Listed> listed;
  for (const auto& pod : list.pod_resources()) {
    for (const auto& c : pod.containers()) {
      for (const auto& d : c.devices()) {
        listed.push_back({d.resource_name(), {d.device_ids().begin(), d.device_ids().end()},
                          absl::StrCat(pod.namespace_(), "/", pod.name(), " container ",
                                       c.name())});
      }
    }
  }
  Learn(listed, /*from_checkpoint=*/false);
}

void Reconciler::ViewsOfList(const v1::ListPodResourcesResponse& list, Holdings* holdings,
                             PodList* pods) {
  for (const auto& pod : list.pod_resources()) {
    holdings->AddPod(pod.namespace_(), pod.name());
    std::set<std::string>& containers = pods->containers[{pod.namespace_(), pod.name()}];
    for (const auto& c : pod.containers()) {
      containers.insert(c.name());
      const size_t index = holdings->AddHolder({pod.namespace_(), pod.name(), c.name(), ""});
      for (const auto& d : c.devices()) {
        for (const std::string& id : d.device_ids()) {
          holdings->AddDevice(index, d.resource_name(), id);
        }
      }
    }
  }
}

namespace {

// The pod names learnt for UIDs (an init container's record has only the
// UID).
std::map<std::string, std::pair<std::string, std::string>> PodsOfUids(const state::State& st) {
  std::map<std::string, std::pair<std::string, std::string>> out;
  for (const state::Allocation& a : st.allocations()) {
    if (!a.pod_uid().empty() && !a.pod_name().empty()) {
      out[a.pod_uid()] = {a.pod_namespace(), a.pod_name()};
    }
  }
  return out;
}

}  // namespace

Reconciler::Verdicts Reconciler::Classify(const state::State& st_now, const Holdings& holdings,
                                          PodList* pods) {
  Verdicts v;
  const std::map<uint64_t, size_t> matched = holdings.Match(st_now);
  const absl::Time now = absl::Now();
  const int64_t now_ms = absl::ToUnixMillis(now);
  // Right after a kubelet start its List is empty or incomplete: a pod
  // missing from it then is not taken as gone.
  v.kubelet_starting = forgotten_.InRestartWindow(now);
  const auto pod_of_uid = PodsOfUids(st_now);
  // The container runtime, asked once, when an allocation's holder needs it.
  std::optional<std::optional<RuntimeView>> asked;
  auto runtime = [&]() -> const RuntimeView* {
    if (!asked.has_value()) asked = forgotten_.RunningContainers();
    return asked->has_value() ? &**asked : nullptr;
  };
  for (const state::Allocation& a : st_now.allocations()) {
    auto m = matched.find(a.id());
    if (m != matched.end()) {
      const PodHolder& h = holdings.holder(m->second);
      v.annotate.push_back({a.id(), h.pod_namespace, h.pod_name, h.container, ""});
      continue;
    }
    const bool pod_listed =
        !a.pod_name().empty() && holdings.HasPod(a.pod_namespace(), a.pod_name());
    if (a.quarantined()) {
      // Forgotten: released as soon as its holder is gone.
      std::string why = forgotten_.HolderGone(a, pods, runtime(), pod_of_uid, now);
      if (!why.empty()) {
        v.forgotten_gone.push_back(a.id());
        v.forgotten_why.push_back(std::move(why));
      }
      continue;
    }
    if (v.kubelet_starting && !pod_listed) continue;
    if (!pod_listed && !a.pod_name().empty()) {
      // Listed before, not now, and the container runtime runs nothing of
      // it: gone, released at once (its device may be what a claim, or the
      // next pod, waits for).
      if (const RuntimeView* r = runtime();
          r != nullptr && !r->Runs(a.pod_uid(), {a.pod_namespace(), a.pod_name()}, "")) {
        v.release.push_back(a.id());
        continue;
      }
    }
    ClassifyMissing(a, pod_listed, now_ms, &v);
  }
  return v;
}

void Reconciler::ClassifyMissing(const state::Allocation& a, bool pod_listed, int64_t now_ms,
                                 Verdicts* v) {
  const bool old_enough =
      now_ms - a.allocated_unix_ms() >= absl::ToInt64Milliseconds(options_.grace);
  if (!old_enough && !pod_listed) return;
  if (missing_once_.count(a.id()) == 0) {
    v->missing.insert(a.id());
    return;
  }
  if (pod_listed) {
    // The kubelet lists the pod as running but no longer these devices:
    // it lost track of them (e.g. it restarted without its checkpoint).
    v->contradicted.push_back(a.id());
    v->contradicted_pods.push_back(absl::StrCat(a.pod_namespace(), "/", a.pod_name()));
  } else {
    v->release.push_back(a.id());
  }
}

absl::Status Reconciler::ReconcileOnce() {
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::ListPodResourcesResponse> list = ListPodResources();
  if (!list.ok()) return list.status();
  absl::MutexLock pass(&pass_mu_);
  LearnFromList(*list);
  Holdings holdings;
  PodList pods;
  ViewsOfList(*list, &holdings, &pods);
  const Verdicts v = Classify(DevicePluginAllocations(), holdings, &pods);
  missing_once_ = v.missing;
  if (!v.release.empty()) {
    LOG(INFO) << "reconciliation: releasing " << v.release.size()
              << " journal entries whose pods are gone";
  }
  absl::StatusOr<int> annotated = keeper_->Reconcile(v.annotate, v.release);
  if (!annotated.ok()) return annotated.status();
  if (!v.forgotten_gone.empty()) forgotten_.Release(v.forgotten_gone, v.forgotten_why);
  if (!v.contradicted.empty()) {
    forgotten_.Mark(v.contradicted,
                    absl::StrCat("the kubelet's pod-resources API lists ",
                                 absl::StrJoin(v.contradicted_pods, ", "),
                                 " without the devices dpproxy allocated to it"));
  }
  events_->Emit("reconciled", {{"pods", list->pod_resources_size()},
                              {"annotated", *annotated},
                              {"released", v.release.size()},
                              {"forgotten_released", v.forgotten_gone.size()},
                              {"contradicted", v.contradicted.size()},
                              {"kubelet_starting", v.kubelet_starting},
                              {"missing_once", missing_once_.size()},
                              {"duration_ms", absl::ToDoubleMilliseconds(absl::Now() - start)}});
  return absl::OkStatus();
}

Reconciler::RestartSeen Reconciler::NoteKubeletRestart(const FileId& kubelet) const {
  // The checkpoint as the restart was seen, before the new kubelet
  // rewrites it: a stat and a read, nothing that grows with allocations.
  RestartSeen seen;
  seen.kubelet = kubelet;
  seen.seen_at = absl::Now();
  const std::string ckpt_path = CheckpointPath();
  seen.checkpoint_before = StatFileId(ckpt_path);
  if (seen.checkpoint_before.has_value()) {
    if (absl::StatusOr<std::string> text = ReadFile(ckpt_path); text.ok()) {
      seen.checkpoint_text = *std::move(text);
    }
  }
  return seen;
}

void Reconciler::OnKubeletRestart(const RestartSeen& seen) {
  // A kubelet restart while dpproxy runs: check that it kept the
  // allocations live now, once it has written its checkpoint again.
  const FileId& kubelet = seen.kubelet;
  RestartCheck check;
  check.checkpoint_before = seen.checkpoint_before;
  check.deadline = seen.seen_at + absl::Seconds(30);
  const state::State st = DevicePluginAllocations();
  // Live for the kubelet that stopped: the checkpoint still on disk is its
  // final view if it predates the new kubelet.sock (a new kubelet writes
  // only after devices register). Otherwise, what the last read listed
  // and anything allocated since. Entries of pods that ended before the
  // restart are thereby never quarantined. Never read at all: every entry.
  std::optional<KubeletCheckpoint> current;
  if (seen.checkpoint_text.has_value()) {
    if (absl::StatusOr<KubeletCheckpoint> k = ParseKubeletCheckpoint(*seen.checkpoint_text);
        k.ok()) {
      current = *std::move(k);
    }
  }
  const bool final_view = current.has_value() && check.checkpoint_before->ctime_ns <=
                                                     kubelet.ctime_ns;
  if (final_view) {
    for (const auto& [id, holder] : CheckpointHoldings(*current).Match(st)) {
      check.live.insert(id);
    }
    for (const state::Allocation& a : st.allocations()) {
      if (a.quarantined()) check.live.erase(a.id());
    }
  } else {
    // (The last read is fresh: the checkpoint is read whenever it
    // changes. Allocations newer than any it listed count only if the file
    // cannot be read now, i.e. the kubelet lost it.)
    absl::MutexLock lock(&checkpoint_mu_);
    for (const state::Allocation& a : st.allocations()) {
      if (a.quarantined()) continue;
      if (!checkpoint_seen_ || checkpoint_live_.count(a.id()) > 0 ||
          (!current.has_value() && a.id() > checkpoint_newest_listed_)) {
        check.live.insert(a.id());
      }
    }
  }
  restart_check_ = std::move(check);  // checked (and reported) even if none is live
}

void Reconciler::FinishRestartCheck(const RestartCheck& check, const std::string& path,
                                    const std::optional<FileId>& id) {
  std::string why;
  absl::StatusOr<KubeletCheckpoint> ckpt = absl::NotFoundError("missing");
  if (!id.has_value()) {
    why = absl::StrCat("the kubelet restarted and has no checkpoint at ", path);
  } else if (absl::StatusOr<std::string> text = ReadFile(path); !text.ok()) {
    why = absl::StrCat("the kubelet restarted and its checkpoint cannot be read: ",
                       text.status().message());
  } else if (ckpt = ParseKubeletCheckpoint(*text); !ckpt.ok()) {
    why = absl::StrCat("the kubelet restarted with an unreadable checkpoint (",
                       ckpt.status().message(), ")");
  }
  std::vector<uint64_t> lost;
  const state::State st = DevicePluginAllocations();
  std::map<uint64_t, size_t> matched;
  if (ckpt.ok()) matched = CheckpointHoldings(*ckpt).Match(st);
  int kept = 0;
  for (const state::Allocation& a : st.allocations()) {
    if (check.live.count(a.id()) == 0 || a.quarantined()) continue;
    if (ckpt.ok() && matched.count(a.id()) > 0) {
      ++kept;
      continue;
    }
    lost.push_back(a.id());
  }
  // A kubelet reads its checkpoint whole or discards it whole: if it still
  // lists any allocation that was live before the restart, it kept them,
  // and those missing are pods that ended meanwhile (released as usual).
  if (kept > 0 && !lost.empty()) {
    LOG(INFO) << "the restarted kubelet kept its checkpoint; " << lost.size()
              << " allocation(s) it no longer lists belong to pods that ended";
    lost.clear();
  }
  if (why.empty()) {
    why = "the kubelet restarted and its checkpoint no longer lists these devices (it lost "
          "them: deleted, corrupt, or written by a release it cannot read)";
  }
  if (!lost.empty()) forgotten_.Mark(lost, why);
  events_->Emit("kubelet_checkpoint_checked", {{"lost", lost.size()},
                                              {"live", check.live.size()}});
}

void Reconciler::CheckCheckpoint() {
  const std::string path = CheckpointPath();
  const std::optional<FileId> id = StatFileId(path);
  const absl::Time now = absl::Now();
  if (restart_check_.has_value()) {
    // Wait until the restarted kubelet wrote its checkpoint (it does at its
    // first device-list update), or for the deadline.
    if (id == restart_check_->checkpoint_before && now < restart_check_->deadline) return;
    RestartCheck check = *std::move(restart_check_);
    restart_check_.reset();
    FinishRestartCheck(check, path, id);
    last_checkpoint_ = id;
    return;
  }
  // Release journal entries the kubelet no longer holds (every release
  // writes its checkpoint; 1.9 kubelets have no pod-resources API): parsed
  // whenever it changes, so that at a kubelet restart dpproxy knows what the
  // kubelet held a moment before.
  // When it changed, and on the reconcile interval
  // (a quiet node writes no new checkpoint, and "missing twice" needs two
  // passes).
  const bool due = options_.interval > absl::ZeroDuration() &&
                   now - last_checkpoint_parse_ >= options_.interval;
  if (!id.has_value() || (id == last_checkpoint_ && !due)) return;
  // The kubelet rewrites its checkpoint at every device-list update, so at
  // every health flip of a plugin: a storm of rewrites is read at most
  // every kCheckpointReadGap, and the last one within a second (this runs
  // at least once a second).
  if (!due && now - last_checkpoint_parse_ < kCheckpointReadGap) return;
  {
    absl::StatusOr<std::string> text = ReadFile(path);
    if (!text.ok()) return;
    absl::StatusOr<KubeletCheckpoint> ckpt = ParseKubeletCheckpoint(*text);
    last_checkpoint_ = id;
    last_checkpoint_parse_ = now;
    if (!ckpt.ok()) {
      VLOG(1) << "kubelet checkpoint not used: " << ckpt.status().message();
    } else {
      absl::MutexLock lock(&checkpoint_mu_);
      (void)CheckpointPass(*ckpt);
    }
  }
  // The text and its parse are gone now.
  if (options_.freed) options_.freed();
}

absl::Status Reconciler::ReconcileCheckpointOnce() {
  const std::string path = CheckpointPath();
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return absl::UnavailableError(text.status().message());
  absl::StatusOr<KubeletCheckpoint> ckpt = ParseKubeletCheckpoint(*text);
  if (!ckpt.ok()) return absl::UnavailableError(ckpt.status().message());
  absl::MutexLock lock(&checkpoint_mu_);
  return CheckpointPass(*ckpt);
}

Holdings Reconciler::CheckpointHoldings(const KubeletCheckpoint& ckpt) {
  Holdings holdings;
  std::map<std::pair<std::string, std::string>, size_t> by_container;
  for (const KubeletCheckpoint::Entry& e : ckpt.entries) {
    auto [it, fresh] = by_container.try_emplace({e.pod_uid, e.container}, 0);
    if (fresh) it->second = holdings.AddHolder({"", "", e.container, e.pod_uid});
    for (const std::string& id : e.device_ids) holdings.AddDevice(it->second, e.resource, id);
  }
  return holdings;
}

void Reconciler::LearnBack(absl::Duration window,
                           std::function<bool(const std::string&)> serves) {
  absl::MutexLock lock(&learn_mu_);
  learn_until_ = absl::Now() + window;
  serves_ = std::move(serves);
}

void Reconciler::Learn(const std::vector<Listed>& listed, bool from_checkpoint) {
  absl::MutexLock lock(&learn_mu_);
  if (absl::Now() >= learn_until_ || !serves_) return;
  int recovered = 0, unrecoverable = 0;
  std::vector<std::string> why_not;
  for (const Listed& e : listed) {
    if (e.device_ids.empty() || !serves_(e.resource)) continue;
    size_t known = 0;
    for (const std::string& id : e.device_ids) known += keeper_->HoldsDevice(e.resource, id);
    if (known == e.device_ids.size()) continue;  // journaled
    const std::string key = absl::StrCat(from_checkpoint, "|", e.resource, "|",
                                         absl::StrJoin(e.device_ids, ","));
    if (known > 0) {
      // Some of its devices are held by another allocation: which one is
      // right is not known here; the reconciler reports holds twice.
      ++unrecoverable;
      if (unrecoverable_seen_.insert(key).second) ++unrecoverable_;
      why_not.push_back(
          absl::StrCat(e.resource, " of ", e.who, ": some devices are journaled elsewhere"));
      continue;
    }
    v1beta1::AllocateRequest req;
    auto* c = req.add_container_requests();
    for (const std::string& id : e.device_ids) c->add_devices_ids(id);
    if (absl::Status s = keeper_->Record(e.resource, req, v1beta1::AllocateResponse(),
                                         BackendSide());
        !s.ok()) {
      ++unrecoverable;
      if (unrecoverable_seen_.insert(key).second) ++unrecoverable_;
      why_not.push_back(absl::StrCat(e.resource, " of ", e.who, ": ", s.message()));
      continue;
    }
    ++recovered;
  }
  if (recovered == 0 && unrecoverable == 0) return;
  (from_checkpoint ? recovered_checkpoint_ : recovered_pod_resources_) += recovered;
  const char* from = from_checkpoint ? "kubelet checkpoint" : "pod-resources";
  LOG(WARNING) << "the state was damaged: " << recovered << " allocation(s) learned back from "
               << (from_checkpoint ? "the kubelet's checkpoint" : "the kubelet's pod-resources API")
               << (unrecoverable > 0 ? absl::StrCat(", ", unrecoverable, " could not be (",
                                                    absl::StrJoin(why_not, "; "), ")")
                                     : std::string());
  events_->Emit("allocations_recovered",
                {{"from", from}, {"recovered", recovered}, {"unrecoverable", unrecoverable}});
}

Reconciler::Verdicts Reconciler::ClassifyByCheckpoint(const state::State& st,
                                                      const Holdings& holdings,
                                                      int64_t now_ms, bool pod_resources) {
  Verdicts v;
  const std::map<uint64_t, size_t> matched = holdings.Match(st);
  for (const state::Allocation& a : st.allocations()) {
    auto m = matched.find(a.id());
    if (m != matched.end()) {
      checkpoint_live_.insert(a.id());
      checkpoint_newest_listed_ = std::max(checkpoint_newest_listed_, a.id());
      const PodHolder& h = holdings.holder(m->second);
      v.annotate.push_back({a.id(), "", "", h.container, h.pod_uid});
      continue;
    }
    // Forgotten: absent from the checkpoint is the symptom, not proof;
    // its pod's directory, or no name within the grace, says it is gone.
    // Where pod-resources exists it decides (it can tell a pod that is gone
    // from one whose devices the kubelet lost); the checkpoint only names.
    if (a.quarantined()) {
      if (pod_resources) continue;
      std::string why =
          forgotten_.HolderGone(a, nullptr, nullptr, {}, absl::FromUnixMillis(now_ms));
      if (!why.empty()) {
        v.forgotten_gone.push_back(a.id());
        v.forgotten_why.push_back(std::move(why));
      }
      continue;
    }
    if (pod_resources) continue;
    if (now_ms - a.allocated_unix_ms() < absl::ToInt64Milliseconds(options_.grace)) {
      continue;
    }
    if (checkpoint_missing_once_.count(a.id()) > 0) {
      v.release.push_back(a.id());
    } else {
      v.missing.insert(a.id());
    }
  }
  return v;
}

absl::Status Reconciler::CheckpointPass(const KubeletCheckpoint& ckpt) {
  {
    std::vector<Listed> listed;
    for (const KubeletCheckpoint::Entry& e : ckpt.entries) {
      listed.push_back({e.resource, e.device_ids,
                        absl::StrCat("pod ", e.pod_uid, " container ", e.container)});
    }
    Learn(listed, /*from_checkpoint=*/true);
  }
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  checkpoint_seen_ = true;
  checkpoint_live_.clear();
  const Verdicts v = ClassifyByCheckpoint(DevicePluginAllocations(), CheckpointHoldings(ckpt),
                                          now_ms, PathExists(PodResourcesSocket()));
  const std::set<uint64_t> missing_before = std::move(checkpoint_missing_once_);
  checkpoint_missing_once_ = v.missing;
  // The kubelet rewrites its checkpoint after every allocation: naming pod
  // UIDs must not cost a snapshot write each time (only releases save).
  absl::StatusOr<int> annotated =
      keeper_->Reconcile(v.annotate, v.release, /*persist_names=*/false);
  if (!annotated.ok()) return annotated.status();
  if (!v.forgotten_gone.empty()) forgotten_.Release(v.forgotten_gone, v.forgotten_why);
  if (!v.release.empty()) {
    LOG(INFO) << "kubelet checkpoint: released " << v.release.size()
              << " journal entries no kubelet container holds any more";
  }
  // A pass that changed nothing (no release, no name learned, the same
  // entries missing) says nothing.
  if (v.release.empty() && v.forgotten_gone.empty() && *annotated == 0 &&
      checkpoint_missing_once_ == missing_before) {
    return absl::OkStatus();
  }
  events_->Emit("checkpoint_reconciled", {{"entries", ckpt.entries.size()},
                                         {"layout", LayoutWriters(ckpt.layout)},
                                         {"released", v.release.size()},
                                         {"missing_once", checkpoint_missing_once_.size()}});
  return absl::OkStatus();
}

}  // namespace dpproxy
