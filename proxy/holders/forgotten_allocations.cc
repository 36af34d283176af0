#include "proxy/holders/forgotten_allocations.h"

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

namespace dpproxy {
namespace {

template <typename T>
const T* OrNull(const std::optional<T>& v) {
  return v.has_value() ? &*v : nullptr;
}

// Adds allocation `id` and why its holder is gone (`why_gone`, "" if it
// is not) to the ones to release; whether it was gone.
bool NoteGone(uint64_t id, std::string why_gone, std::vector<uint64_t>* gone,
              std::vector<std::string>* why) {
  if (why_gone.empty()) return false;
  gone->push_back(id);
  why->push_back(std::move(why_gone));
  return true;
}

// Those of `all` that name any of `ids`.
std::vector<state::Allocation> Naming(const std::vector<state::Allocation>& all,
                                      const std::set<std::string>& ids) {
  std::vector<state::Allocation> out;
  for (const state::Allocation& a : all) {
    for (const std::string& d : a.device_ids()) {
      if (ids.count(d) > 0) {
        out.push_back(a);
        break;
      }
    }
  }
  return out;
}

}  // namespace

ForgottenAllocations::ForgottenAllocations(Options options, StateKeeper* keeper,
                                           EventLog* events, std::function<void()> changed)
    : options_(std::move(options)), keeper_(keeper), events_(events),
      changed_(std::move(changed)) {}

void ForgottenAllocations::Mark(const std::vector<uint64_t>& ids, const std::string& reason) {
  absl::StatusOr<int> added = keeper_->Quarantine(ids, reason);
  if (!added.ok()) {
    LOG(ERROR) << "cannot persist the quarantine of " << ids.size()
               << " allocation(s) (kept in memory): " << added.status().message();
  }
  if (added.ok() && *added == 0) return;
  const state::State st = keeper_->AllocationsSnapshot();
  const std::set<uint64_t> wanted(ids.begin(), ids.end());
  // Which live allocations hold each device, to report a device held twice
  // (DRA claims' are the kubelet's to end, never forgotten).
  std::map<std::pair<std::string, std::string>, std::vector<const state::Allocation*>> by_device;
  for (const state::Allocation& a : st.allocations()) {
    if (a.has_claim()) continue;
    for (const std::string& d : a.device_ids()) by_device[{a.resource(), d}].push_back(&a);
  }
  auto who = [](const state::Allocation& a) {
    return a.pod_name().empty()
               ? absl::StrCat("allocation ", a.id(),
                              a.pod_uid().empty() ? "" : absl::StrCat(" (pod UID ", a.pod_uid(), ")"),
                              " of an unknown pod")
               : absl::StrCat(a.pod_namespace(), "/", a.pod_name(), "/", a.container());
  };
  for (const state::Allocation& a : st.allocations()) {
    if (wanted.count(a.id()) == 0 || a.has_claim()) continue;
    LOG(ERROR) << "resource " << a.resource() << ": devices "
               << absl::StrJoin(a.device_ids(), ",") << " of " << who(a)
               << " are forgotten by the kubelet, which counts them free: new pods are "
                  "steered away from them and an Allocate naming one is refused until "
                  "that container is gone: "
               << reason;
    events_->Emit("devices_forgotten", {{"resource", a.resource()},
                                         {"allocation", a.id()},
                                         {"devices", std::vector<std::string>(
                                                         a.device_ids().begin(),
                                                         a.device_ids().end())},
                                         {"holder", who(a)},
                                         {"reason", reason}});
    for (const std::string& d : a.device_ids()) {
      for (const state::Allocation* other : by_device[{a.resource(), d}]) {
        if (other->id() <= a.id() || other->quarantined()) continue;
        ++devices_held_twice_;
        LOG(ERROR) << "resource " << a.resource() << ": device " << d
                   << " is held twice: by " << who(a) << " and, allocated since, by "
                   << who(*other) << " (the kubelet handed it out again)";
        events_->Emit("device_held_twice", {{"resource", a.resource()},
                                           {"device", d},
                                           {"first", who(a)},
                                           {"second", who(*other)}});
      }
    }
  }
  changed_();
}

std::map<std::string, std::map<std::string, std::string>> ForgottenAllocations::Devices(
    std::vector<ForgottenStatus>* rows) const {
  std::map<std::string, std::map<std::string, std::string>> devices;
  // Read in place: a copy of every allocation for the few forgotten.
  keeper_->ForEachAllocation([&](const state::Allocation& a) {
    if (!a.quarantined()) return;
    const std::string holder =
        a.pod_name().empty()
            ? absl::StrCat("a container of ",
                           a.pod_uid().empty() ? std::string("a pod never named")
                                               : absl::StrCat("pod UID ", a.pod_uid()),
                           a.container().empty() ? "" : absl::StrCat(" (", a.container(), ")"))
            : absl::StrCat(a.pod_namespace(), "/", a.pod_name(), "/", a.container());
    for (const std::string& d : a.device_ids()) devices[a.resource()][d] = holder;
    if (rows == nullptr) return;
    ForgottenStatus q;
    q.resource = a.resource();
    q.allocation = a.id();
    q.devices.assign(a.device_ids().begin(), a.device_ids().end());
    q.pod = a.pod_name().empty() ? std::string() : absl::StrCat(a.pod_namespace(), "/", a.pod_name());
    q.container = a.container();
    q.pod_uid = a.pod_uid();
    q.reason = a.quarantine_reason();
    q.since_unix_ms = a.quarantined_unix_ms();
    rows->push_back(std::move(q));
  });
  return devices;
}

std::optional<PodList> ForgottenAllocations::ListPods() const {
  const std::string socket = KubeletPodResourcesSocket(options_.kubelet);
  if (!PathExists(socket)) return std::nullopt;
  auto stub = v1::PodResourcesLister::NewStub(MakeUnixChannel(socket));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  v1::ListPodResourcesResponse list;
  if (!stub->List(&ctx, v1::ListPodResourcesRequest(), &list).ok()) return std::nullopt;
  PodList pods;
  for (const auto& pod : list.pod_resources()) {
    std::set<std::string>& containers = pods.containers[{pod.namespace_(), pod.name()}];
    for (const auto& c : pod.containers()) containers.insert(c.name());
  }
  return pods;
}

bool ForgottenAllocations::InRestartWindow(absl::Time now) {
  const std::optional<FileId> kubelet = StatFileId(KubeletSocketPath(options_.kubelet));
  absl::MutexLock lock(&window_mu_);
  if (kubelet != window_kubelet_) {
    window_kubelet_ = kubelet;
    named_since_restart_.clear();
    picked_since_restart_.clear();
    readmitted_since_restart_.clear();
  }
  if (!kubelet.has_value()) return true;  // no kubelet: nothing it says is complete
  return now - absl::FromUnixNanos(kubelet->ctime_ns) < options_.restart_grace;
}

bool RuntimeView::Runs(const std::string& uid, const std::pair<std::string, std::string>& pod,
                                   const std::string& container) const {
  if (!uid.empty()) {
    return container.empty() ? pod_uids.count(uid) > 0 : by_uid.count({uid, container}) > 0;
  }
  return container.empty() ? pods.count(pod) > 0
                           : by_name.count({pod.first, pod.second, container}) > 0;
}

std::optional<RuntimeView> ForgottenAllocations::RunningContainers() const {
  std::string socket = options_.container_runtime_socket;
  if (absl::StartsWith(socket, "unix://")) socket = socket.substr(7);
  if (socket.empty() || !PathExists(socket)) return std::nullopt;
  auto stub = runtime::v1::RuntimeService::NewStub(MakeUnixChannel(socket));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  runtime::v1::ListContainersRequest req;
  req.mutable_filter()->mutable_state()->set_state(runtime::v1::CONTAINER_RUNNING);
  runtime::v1::ListContainersResponse resp;
  if (grpc::Status st = stub->ListContainers(&ctx, req, &resp); !st.ok()) {
    LOG_EVERY_N(WARNING, 20) << "the container runtime at " << socket
                             << " did not list its containers (" << DescribeGrpcStatus(st)
                             << "); holders are checked with the kubelet's sources only";
    return std::nullopt;
  }
  RuntimeView view;
  for (const runtime::v1::Container& c : resp.containers()) {
    if (c.state() != runtime::v1::CONTAINER_RUNNING) continue;  // a runtime that ignores filters
    auto label = [&c](const char* key) {
      auto it = c.labels().find(key);
      return it == c.labels().end() ? std::string() : it->second;
    };
    const std::string uid = label("io.kubernetes.pod.uid");
    const std::string ns = label("io.kubernetes.pod.namespace");
    const std::string pod = label("io.kubernetes.pod.name");
    std::string name = label("io.kubernetes.container.name");
    if (name.empty()) name = c.metadata().name();
    if (!uid.empty()) {
      view.pod_uids.insert(uid);
      view.by_uid.insert({uid, name});
    }
    if (!pod.empty()) {
      view.pods.insert({ns, pod});
      view.by_name.insert({ns, pod, name});
    }
  }
  return view;
}

std::string ForgottenAllocations::GoneFromList(const state::Allocation& a,
                                               const std::pair<std::string, std::string>& pod,
                                               const PodList& list, absl::Time now) {
  const bool window = InRestartWindow(now);
  auto listed = list.containers.find(pod);
  if (listed != list.containers.end()) {
    {
      absl::MutexLock lock(&window_mu_);
      named_since_restart_.insert(a.id());
    }
    // pod-resources lists every app container of a running pod: one it
    // does not list is an init container that has ended.
    if (!a.container().empty() && !listed->second.empty() &&
        listed->second.count(a.container()) == 0) {
      return absl::StrCat("container ", a.container(), " of ", pod.first, "/", pod.second,
                          " is not one the kubelet runs (an init container that ended)");
    }
    return "";
  }
  bool named_since;
  {
    absl::MutexLock lock(&window_mu_);
    named_since = named_since_restart_.count(a.id()) > 0;
  }
  if (window && !named_since) return "";  // the List may not be complete yet
  return absl::StrCat("pod ", pod.first, "/", pod.second,
                      " is no longer listed by the kubelet's pod-resources API");
}

std::string ForgottenAllocations::HolderGone(
    const state::Allocation& a, const PodList* list, const RuntimeView* runtime,
    const std::map<std::string, std::pair<std::string, std::string>>& pod_of_uid,
    absl::Time now) {
  // The kubelet keeps <root>/pods/<UID> while the pod is on the node (and
  // a few seconds after: a List says sooner).
  const std::string pods_dir = JoinPath(options_.kubelet.kubelet_root, "pods");
  if (!a.pod_uid().empty() && PathExists(pods_dir) &&
      !PathExists(JoinPath(pods_dir, a.pod_uid()))) {
    return absl::StrCat("the kubelet's directory of pod ", a.pod_uid(), " is gone");
  }
  std::pair<std::string, std::string> pod{a.pod_namespace(), a.pod_name()};
  if (pod.second.empty() && !a.pod_uid().empty()) {
    auto it = pod_of_uid.find(a.pod_uid());
    if (it != pod_of_uid.end()) pod = it->second;
  }
  if (runtime != nullptr && (!a.pod_uid().empty() || !pod.second.empty()) &&
      !runtime->Runs(a.pod_uid(), pod, a.container())) {
    // Whatever the kubelet lists: a container that never started (its
    // creation failed) or has ended uses no device. Should it start later,
    // the kubelet, which forgot its devices, allocates again for it.
    const std::string who =
        pod.second.empty() ? absl::StrCat("pod UID ", a.pod_uid())
                           : absl::StrCat(pod.first, "/", pod.second);
    return absl::StrCat("the container runtime runs no container ",
                        a.container().empty() ? std::string("") : absl::StrCat(a.container(), " "),
                        "of ", who, " (it never started, or has ended)");
  }
  if (!pod.second.empty() && list != nullptr) return GoneFromList(a, pod, *list, now);
  if (pod.second.empty() &&
      now - absl::FromUnixMillis(a.quarantined_unix_ms()) >= options_.grace) {
    // Never named: an Allocate whose pod then failed admission, or an init
    // container. Nothing will ever say it ended.
    return absl::StrCat("no kubelet source has named its pod within ",
                        absl::FormatDuration(options_.grace));
  }
  return "";
}

void ForgottenAllocations::Release(const std::vector<uint64_t>& ids,
                                   const std::vector<std::string>& why) {
  absl::StatusOr<int> done = keeper_->Reconcile({}, ids);
  if (!done.ok()) {
    LOG(ERROR) << "cannot release " << ids.size()
               << " forgotten allocation(s): " << done.status().message();
    return;
  }
  released_ += static_cast<int64_t>(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    LOG(INFO) << "allocation " << ids[i] << " released: its holder is gone (" << why[i] << ")";
    events_->Emit("forgotten_released", {{"allocation", ids[i]}, {"why", why[i]}});
  }
  changed_();
}

ForgottenAllocations::View ForgottenAllocations::Of(const std::string& resource) const {
  View view;
  keeper_->ForEachAllocation([&](const state::Allocation& a) {
    if (!a.pod_uid().empty() && !a.pod_name().empty()) {
      view.pod_of_uid[a.pod_uid()] = {a.pod_namespace(), a.pod_name()};
    }
    if (a.quarantined() && a.resource() == resource) view.all.push_back(a);
  });
  std::sort(view.all.begin(), view.all.end(),
            [](const state::Allocation& x, const state::Allocation& y) { return x.id() < y.id(); });
  return view;
}

std::set<std::string> ForgottenAllocations::StillForgotten(const std::string& resource,
                                                           const std::vector<std::string>& ids) {
  const std::set<std::string> wanted(ids.begin(), ids.end());
  const View view = Of(resource);
  const std::vector<state::Allocation> holders = Naming(view.all, wanted);
  const auto& pod_of_uid = view.pod_of_uid;
  std::set<std::string> still;
  if (holders.empty()) return still;
  const std::optional<PodList> list = ListPods();
  const std::optional<RuntimeView> runtime = RunningContainers();
  const absl::Time now = absl::Now();
  std::vector<uint64_t> gone;
  std::vector<std::string> why;
  for (const state::Allocation& a : holders) {
    if (NoteGone(a.id(), HolderGone(a, OrNull(list), OrNull(runtime), pod_of_uid, now), &gone,
                 &why)) {
      continue;
    }
    for (const std::string& d : a.device_ids()) {
      if (wanted.count(d) > 0) still.insert(d);
    }
  }
  if (!gone.empty()) Release(gone, why);
  return still;
}

std::vector<std::string> ForgottenAllocations::ReadmissionPick(
    const std::string& resource, int size, const std::set<std::string>& available) {
  if (size <= 0 || !InRestartWindow(absl::Now())) return {};
  // Re-admission goes in creation order: the oldest forgotten container
  // not picked yet is the one being re-admitted.
  const View view = Of(resource);
  absl::MutexLock lock(&window_mu_);
  for (const state::Allocation& a : view.all) {
    const uint64_t id = a.id();
    const std::vector<std::string> devices(a.device_ids().begin(), a.device_ids().end());
    if (picked_since_restart_.count(id) > 0) continue;
    if (static_cast<int>(devices.size()) != size) return {};
    for (const std::string& d : devices) {
      if (available.count(d) == 0) return {};
    }
    picked_since_restart_.insert(id);
    events_->Emit("readmission_steered",
                  {{"resource", resource}, {"allocation", id}, {"devices", devices}});
    return devices;
  }
  return {};
}

bool ForgottenAllocations::MatchReadmissions(
    const std::string& resource, const std::vector<std::vector<std::string>>& per_container,
    const View& view, std::set<std::string>* wanted, std::vector<uint64_t>* gone,
    std::vector<std::string>* why) {
  // A kubelet re-admitting running containers it forgot, oldest first: a
  // request of the size of the oldest one not yet re-admitted is its
  // re-admission. With exactly its own devices the kubelet knows them
  // again (that record goes, the new one takes its place); with others (a
  // kubelet before 1.19 picks them itself) the records stay, since they
  // hold what the containers use, and the new one is kept beside.
  std::set<std::string> forgotten_devices;
  for (const state::Allocation& a : view.all) {
    forgotten_devices.insert(a.device_ids().begin(), a.device_ids().end());
  }
  bool inexact = false;
  absl::MutexLock lock(&window_mu_);
  for (const auto& c : per_container) {
    const std::set<std::string> asked(c.begin(), c.end());
    bool names_forgotten = false;
    for (const std::string& d : asked) names_forgotten |= forgotten_devices.count(d) > 0;
    if (!names_forgotten) continue;
    const state::Allocation* next = nullptr;
    for (const state::Allocation& a : view.all) {  // oldest first
      if (readmitted_since_restart_.count(a.id()) == 0) {
        next = &a;
        break;
      }
    }
    const bool same_size =
        next != nullptr && static_cast<size_t>(next->device_ids_size()) == asked.size();
    const bool exact = same_size && std::set<std::string>(next->device_ids().begin(),
                                                          next->device_ids().end()) == asked;
    if (exact) {
      readmitted_since_restart_.insert(next->id());
      gone->push_back(next->id());
      why->push_back("re-admitted: the restarted kubelet allocated its own devices again");
    } else if (same_size) {
      readmitted_since_restart_.insert(next->id());
      inexact = true;
      events_->Emit("readmitted_elsewhere",
                    {{"resource", resource},
                     {"allocation", next->id()},
                     {"devices", std::vector<std::string>(c.begin(), c.end())}});
    } else {
      wanted->insert(c.begin(), c.end());  // checked as any Allocate
    }
  }
  return inexact;
}

absl::StatusOr<bool> ForgottenAllocations::CheckForgotten(
    const std::string& resource, const std::vector<std::vector<std::string>>& per_container,
    bool readmission) {
  std::set<std::string> wanted;
  for (const auto& c : per_container) wanted.insert(c.begin(), c.end());
  const View view = Of(resource);
  const std::vector<state::Allocation> holders = Naming(view.all, wanted);
  if (holders.empty()) {
    changed_();  // the caller's view is stale
    return false;
  }
  const absl::Time now = absl::Now();
  std::vector<uint64_t> gone;
  std::vector<std::string> why, running;
  bool inexact = false;
  if (readmission && InRestartWindow(now)) {
    wanted.clear();
    inexact = MatchReadmissions(resource, per_container, view, &wanted, &gone, &why);
  }
  const std::set<uint64_t> readmitted(gone.begin(), gone.end());
  const std::optional<PodList> list = ListPods();
  const std::optional<RuntimeView> runtime = RunningContainers();
  for (const state::Allocation& a : holders) {
    if (readmitted.count(a.id()) > 0) continue;
    bool named = false;
    for (const std::string& d : a.device_ids()) named |= wanted.count(d) > 0;
    if (!named) continue;
    if (NoteGone(a.id(), HolderGone(a, OrNull(list), OrNull(runtime), view.pod_of_uid, now),
                 &gone, &why)) {
      continue;
    }
    std::vector<std::string> devices;
    for (const std::string& d : a.device_ids()) {
      if (wanted.count(d) > 0) devices.push_back(d);
    }
    running.push_back(absl::StrCat(
        absl::StrJoin(devices, ", "), " (held by ",
        a.pod_name().empty()
            ? absl::StrCat("a container of ",
                           a.pod_uid().empty() ? std::string("a pod never named")
                                               : absl::StrCat("pod UID ", a.pod_uid()))
            : absl::StrCat("pod ", a.pod_namespace(), "/", a.pod_name(), " container ",
                           a.container()),
        ")"));
  }
  if (!gone.empty()) Release(gone, why);
  if (running.empty()) return inexact;
  const std::string message = absl::StrCat(
      "device(s) ", absl::StrJoin(running, "; "), " of ", resource,
      " are still in use by a running container the kubelet lost track of (it restarted "
      "without its checkpoint and counts them free); dpproxy refuses to hand them out twice, "
      "until that container is gone");
  LOG(WARNING) << "Allocate refused: " << message;
  events_->Emit("allocate_refused_forgotten", {{"resource", resource}, {"message", message}});
  return absl::FailedPreconditionError(message);
}

}  // namespace dpproxy
