#include "proxy/kubelet_side/device_plugin/registrar.h"

#include <grpcpp/client_context.h>
#include <glog/logging.h>

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proxy/rpc/grpc_util.h"

namespace dpproxy {

// How long after the kubelet ends our stream the registrar looks whether
// that kubelet still runs (and so dropped this endpoint): a restarting
// kubelet has by then replaced its socket or stopped listening.
constexpr absl::Duration kDropSettle = absl::Milliseconds(200);

Registrar::Registrar(KubeletSideOptions kubelet, EventLog* events, WorkQueue* workers,
                     std::function<void()> wake)
    : kubelet_(std::move(kubelet)), events_(events), workers_(workers), wake_(std::move(wake)) {}

void Registrar::Add(Resource* resource, DevicePluginServer* endpoint) {
  auto slot = std::make_unique<Slot>();
  slot->resource = resource;
  slot->endpoint = endpoint;
  Slot* raw = slot.get();
  endpoint->SetStreamDroppedHook([this, raw] { OnStreamDropped(raw); });
  absl::MutexLock lock(&mu_);
  slots_.push_back(std::move(slot));
}

void Registrar::Remove(DevicePluginServer* endpoint) {
  absl::MutexLock lock(&mu_);
  for (auto it = slots_.begin(); it != slots_.end(); ++it) {
    if ((*it)->endpoint != endpoint) continue;
    removed_slots_.push_back(std::move(*it));
    slots_.erase(it);
    return;
  }
}

void Registrar::OnStreamDropped(Slot* e) {
  // A list over the kubelet's limit ends every stream it is sent on:
  // registering again soon changes nothing until the list changes.
  const size_t list_bytes = e->resource->Current().list->bytes();
  const bool too_large = list_bytes > kKubeletMaxListBytes;
  {
    absl::MutexLock lock(&mu_);
    if (held_ || !e->registered_with.has_value()) return;
    // The kubelet no longer streams from this endpoint: whatever the cause
    // (a restart is also seen by its new socket), register again. At once
    // the first time; a kubelet that keeps dropping it (another plugin
    // registering the same name) is answered with the usual backoff.
    const absl::Time now = absl::Now();
    if (now - e->last_drop < absl::Seconds(10)) {
      e->backoff = std::min(absl::Seconds(5), std::max(absl::Milliseconds(100), e->backoff * 2));
    } else {
      e->backoff = absl::ZeroDuration();
    }
    if (too_large) {
      e->backoff = std::max(e->backoff, kTooLargeRetry);
      if (!e->too_large_said) {
        LOG(ERROR) << "resource " << e->resource->name() << ": the kubelet ends its stream "
                   << "because the device list is " << list_bytes << " bytes, over its "
                   << kKubeletMaxListBytes << "; registering again every "
                   << absl::FormatDuration(kTooLargeRetry)
                   << " until the list fits (compact_ids, or fewer devices)";
        e->too_large_said = true;
      }
    } else {
      e->too_large_said = false;
    }
    e->last_drop = now;
    e->dropped = true;
    // A kubelet that restarts also ends every stream: by then it has
    // usually wiped our socket or made a new one of its own, and the
    // restart is handled as such.
    e->retry_at =
        now + std::max(e->backoff, now < expect_drop_until_ ? absl::ZeroDuration() : kDropSettle);
    if (!too_large) {
      LOG(INFO) << "resource " << e->resource->name() << ": the kubelet ended its stream";
    }
    events_->Emit("kubelet_stream_dropped", {{"resource", e->resource->name()}});
  }
  wake_();
}

void Registrar::ServeRemoved(const std::vector<Slot*>& slots) {
  // Serving again is quick and happens here, even while a Register of the
  // same resource waits on the kubelet's dial: that dial then finds the
  // socket again.
  for (Slot* e : slots) {
    if (e->endpoint->SocketPresent()) continue;
    bool first;
    uint64_t registrations;
    {
      absl::MutexLock lock(&mu_);
      first = !e->registered_with.has_value() && e->endpoint->negotiated().empty();
      registrations = e->registrations;
    }
    if (absl::Status s = e->endpoint->Serve(); !s.ok()) {
      LOG(ERROR) << "resource " << e->resource->name() << ": " << s.message();
      continue;
    }
    if (after_served_again_hook_) after_served_again_hook_();
    {
      absl::MutexLock lock(&mu_);
      ++e->served;
      // A Register that ended while the socket was served again counted as
      // made before it. If the kubelet's dial-back reached the new server,
      // the kubelet holds the socket as served now: registering there again
      // is refused by a 1.37 kubelet ("device plugin already connected").
      const bool held = e->registrations != registrations &&
                        e->endpoint->registration_reached_current_server();
      if (held) {
        LOG(INFO) << "resource " << e->resource->name()
                  << ": registered while served again; the kubelet dialled the new server";
      } else {
        e->registered_with.reset();
      }
      e->dropped = false;
      e->backoff = absl::ZeroDuration();
      e->retry_at = absl::InfinitePast();
    }
    // Said once the registrar knows: a Register that ends from now on
    // counts as one made while the socket was served again.
    if (!first) {
      LOG(INFO) << "resource " << e->resource->name()
                << ": kubelet restart detected (our socket was removed); serving again";
      events_->Emit("kubelet_restart_detected",
                    {{"resource", e->resource->name()}, {"signal", "socket removed"}});
    }
  }
}

absl::StatusOr<std::set<std::string>> Registrar::AllocatableResources() {
  const std::string socket = KubeletPodResourcesSocket(kubelet_);
  if (!PathExists(socket)) {
    return absl::UnavailableError(absl::StrCat("no pod-resources API at ", socket));
  }
  auto stub = ::v1::PodResourcesLister::NewStub(MakeUnixChannel(socket));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  ::v1::AllocatableResourcesRequest req;
  ::v1::AllocatableResourcesResponse resp;
  const grpc::Status st = stub->GetAllocatableResources(&ctx, req, &resp);
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat("GetAllocatableResources at ", socket, ": ",
                                               st.error_message()));
  }
  std::set<std::string> listed;
  for (const auto& d : resp.devices()) {
    if (d.device_ids_size() > 0) listed.insert(d.resource_name());
  }
  return listed;
}

void Registrar::CheckReclaims(const std::vector<Slot*>& slots, absl::Time now) {
  std::vector<Slot*> due;
  {
    absl::MutexLock lock(&mu_);
    if (held_) return;
    for (Slot* e : slots) {
      if (e->reclaim_at != absl::InfinitePast()) due.push_back(e);
    }
  }
  if (due.empty()) return;
  absl::StatusOr<std::set<std::string>> listed = AllocatableResources();
  absl::MutexLock lock(&mu_);
  for (Slot* e : due) {
    const bool let_go = listed.ok() && listed->count(e->resource->name()) == 0;
    if (!let_go && now < e->reclaim_at) {
      // Looked at again soon: the kubelet lets a stream go in milliseconds.
      next_retry_ = std::min(next_retry_, now + absl::Milliseconds(100));
      continue;
    }
    LOG(INFO) << "resource " << e->resource->name() << ": "
              << (let_go ? std::string("the kubelet lists none of its devices")
                         : absl::StrCat("no sign from the kubelet within ",
                                        absl::FormatDuration(kReclaimWait),
                                        listed.ok() ? "" : absl::StrCat(
                                            " (", listed.status().message(), ")")))
              << "; registering again";
    events_->Emit("kubelet_endpoint_reclaimed",
                  {{"resource", e->resource->name()}, {"seen_let_go", let_go}});
    e->reclaim_at = absl::InfinitePast();
  }
}

Registrar::PassResult Registrar::Pass(absl::Time now) {
  PassResult result;
  std::vector<Slot*> slots;
  {
    absl::MutexLock lock(&mu_);
    for (auto& s : slots_) slots.push_back(s.get());
    next_retry_ = absl::InfiniteFuture();
  }
  ServeRemoved(slots);
  CheckReclaims(slots, now);
  const std::optional<FileId> kubelet = StatFileId(KubeletSocketPath(kubelet_));
  if (kubelet.has_value() && last_kubelet_.has_value() && kubelet != last_kubelet_) {
    result.kubelet_restarted = kubelet;
  }
  if (kubelet.has_value()) last_kubelet_ = kubelet;
  if (kubelet_.registration == KubeletRegistration::kPluginWatcher || !kubelet.has_value()) {
    return result;  // the kubelet comes to us, or is not there yet (the watcher wakes us)
  }
  // Whether the kubelet listens at its socket: asked (once a pass) only
  // for a resource whose stream the kubelet ended. A kubelet going down
  // ends every stream too; its restart is then seen by its new socket.
  std::optional<bool> listening;
  for (Slot* e : slots) {
    std::string options = e->resource->options().SerializeAsString();
    uint64_t served = 0;
    {
      absl::MutexLock lock(&mu_);
      if (!RegistrationDueLocked(e, *kubelet, result.kubelet_restarted.has_value(), now,
                                 &options, &listening)) {
        continue;
      }
      e->registering = true;
      served = e->served;
    }
    if (!workers_->Submit([this, e, k = *kubelet, o = std::move(options), served]() mutable {
          RegisterOnWorker(e, k, std::move(o), served);
        })) {
      absl::MutexLock lock(&mu_);
      e->registering = false;
    }
  }
  absl::MutexLock lock(&mu_);
  result.next_retry = next_retry_;
  return result;
}

bool Registrar::RegistrationDueLocked(Slot* e, const FileId& kubelet, bool kubelet_restarted,
                                      absl::Time now, std::string* options,
                                      std::optional<bool>* listening) {
  if (kubelet_restarted) {
    // A new kubelet: no backoff left from the old one's drops.
    e->backoff = absl::ZeroDuration();
    e->retry_at = absl::InfinitePast();
    e->dropped = false;
  }
  bool dropped_by_live_kubelet = false;
  if (e->dropped && e->registered_with == kubelet && !held_ && !e->registering) {
    if (now < e->retry_at) {
      next_retry_ = std::min(next_retry_, e->retry_at);
      return false;
    }
    // Still the same kubelet, listening, and our socket where it was: that
    // kubelet dropped this endpoint.
    if (!e->endpoint->SocketPresent()) return false;  // ServeRemoved's
    if (!listening->has_value()) {
      mu_.Unlock();
      *listening = SocketAccepts(KubeletSocketPath(kubelet_));
      mu_.Lock();
    }
    if (!**listening) return false;
    dropped_by_live_kubelet = true;
  }
  if (held_ || e->registering) return false;
  if (e->reclaim_at != absl::InfinitePast()) return false;  // CheckReclaims
  bool options_changed = false;
  if (e->registered_with == kubelet && !e->dropped) {
    if (e->registered_options == *options) return false;
    if (e->endpoint->kubelet_registers_synchronously()) {
      // A 1.25+ kubelet read the options when it dialled and keeps them;
      // registering again at this socket while it streams from it is
      // refused by a 1.37 kubelet, which then never disconnects the socket.
      // The endpoint follows what the kubelet was told (PreStartContainer:
      // device_plugin_server.h).
      LOG(INFO) << "resource " << e->resource->name() << ": the backend's options changed; "
                << "the kubelet keeps the ones it read (PreStartContainer "
                << (e->endpoint->kubelet_calls_pre_start().value_or(false) ? "" : "not ")
                << "called by it), and dpproxy serves the difference";
      e->registered_options = std::move(*options);
      return false;
    }
    options_changed = true;
  } else if (e->registered_with == kubelet) {
    // Dropped by this kubelet, which still runs (OnStreamDropped): it
    // disconnected this resource's client.
    if (dropped_by_live_kubelet && now >= e->retry_at) {
      LOG(INFO) << "resource " << e->resource->name()
                << ": the running kubelet dropped our endpoint; registering again";
    }
  } else if (e->registered_with.has_value()) {
    LOG(INFO) << "resource " << e->resource->name()
              << ": kubelet restart detected (new kubelet.sock); registering again";
    events_->Emit("kubelet_restart_detected", {{"resource", e->resource->name()},
                                               {"signal", "kubelet.sock recreated"}});
    e->registered_with.reset();
    e->backoff = absl::ZeroDuration();
    e->retry_at = absl::InfinitePast();
  }
  if (now < e->retry_at) {
    next_retry_ = std::min(next_retry_, e->retry_at);
    return false;
  }
  if (options_changed) {
    LOG(INFO) << "resource " << e->resource->name() << ": options changed; registering again";
  }
  return true;
}

void Registrar::Resume(bool successor_registered) {
  std::vector<DevicePluginServer*> endpoints;
  {
    absl::MutexLock lock(&mu_);
    for (auto& slot : slots_) endpoints.push_back(slot->endpoint);
  }
  std::set<DevicePluginServer*> still_streamed;
  for (DevicePluginServer* e : endpoints) {
    if (e->kubelet_registers_synchronously() && e->kubelet_streaming()) {
      still_streamed.insert(e);
      if (successor_registered) e->EndKubeletStreams();
    }
  }
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  held_ = false;
  for (auto& slot : slots_) {
    if (still_streamed.count(slot->endpoint) > 0) {
      if (!successor_registered) {
        LOG(INFO) << "resource " << slot->resource->name() << ": taken back while the kubelet "
                  << "still streams from " << slot->endpoint->socket_path() << ", and the new "
                  << "dpproxy never registered: left as it is";
        continue;
      }
      LOG(INFO) << "resource " << slot->resource->name() << ": taken back while the kubelet "
                << "streamed from " << slot->endpoint->socket_path() << ", after the new "
                << "dpproxy had registered: that stream was ended, and the resource is "
                << "registered again once the kubelet has let it go";
      slot->reclaim_at = now + kReclaimWait;
      next_retry_ = std::min(next_retry_, now);
    }
    slot->registered_with.reset();
    slot->dropped = false;
    slot->backoff = absl::ZeroDuration();
    slot->retry_at = absl::InfinitePast();
  }
}

void Registrar::ScheduleRetryLocked(Slot* e, const absl::Status& s, bool kubelet_replaced,
                                    bool not_serving) {
  // Retried soon, with backoff: not only at the next kubelet restart.
  const absl::Duration cap = s.code() == absl::StatusCode::kUnavailable ||
                                     s.code() == absl::StatusCode::kDeadlineExceeded
                                 ? absl::Seconds(5)
                                 : absl::Seconds(30);
  if (kubelet_replaced) {
    // The kubelet restarted while this registration was on its way
    // (the pass that saw the new kubelet left this one alone while it
    // ran): register with the new kubelet at once, as the others are.
    // Waiting out the backoff here was a 100 ms tail of re-registration.
    e->backoff = absl::ZeroDuration();
    e->retry_at = absl::Now();
  } else if (not_serving && e->backoff == absl::ZeroDuration()) {
    // The wipe of a kubelet that just started, seen between this
    // registration's queueing and its start: the pass this wakes serves
    // the socket again and registers at once (a 100 ms wait here was
    // most of the slowest re-registrations). Only once in a row: a
    // socket that keeps going goes back to the backoff below.
    e->backoff = absl::Milliseconds(1);
    e->retry_at = absl::Now();
  } else {
    e->backoff = std::min(cap, std::max(absl::Milliseconds(100), e->backoff * 2));
    e->retry_at = absl::Now() + e->backoff;
  }
  next_retry_ = std::min(next_retry_, e->retry_at);
  LOG(INFO) << "resource " << e->resource->name() << ": registration failed ("
            << s.message() << "); retrying in "
            << absl::FormatDuration(absl::Ceil(
                   std::max(absl::ZeroDuration(), e->retry_at - absl::Now()),
                   absl::Milliseconds(1)));
  events_->Emit("kubelet_registration_retry",
                {{"resource", e->resource->name()},
                 {"retry_in_ms", absl::ToInt64Milliseconds(
                                     std::max(absl::ZeroDuration(), e->retry_at - absl::Now()))},
                 {"kubelet_replaced", kubelet_replaced},
                 {"error", std::string(s.message())}});
}

void Registrar::RegisterOnWorker(Slot* e, FileId kubelet, std::string options, uint64_t served) {
  absl::Status s;
  bool not_serving = false;
  // The kubelet.sock the registration reached: a kubelet that started
  // since the pass looked (`kubelet`) is the one registered with.
  std::optional<FileId> reached;
  if (!e->endpoint->SocketPresent()) {
    // Never ask a kubelet to dial a socket that is not serving (a kubelet's
    // wipe removed it after this was queued): the next pass serves it again,
    // then registers.
    s = absl::UnavailableError("our socket is not serving");
    not_serving = true;
  } else {
    if (before_register_hook_) before_register_hook_();
    s = e->endpoint->Register(&reached);
  }
  // A registration that failed because its kubelet went away says nothing
  // about the one that replaced it.
  const bool kubelet_replaced =
      !s.ok() && StatFileId(KubeletSocketPath(kubelet_)).value_or(kubelet) != kubelet;
  {
    absl::MutexLock lock(&mu_);
    e->registering = false;
    const bool reached_current = s.ok() && e->served != served &&
                                 e->endpoint->registration_reached_current_server();
    if (s.ok() && e->served != served) {
      events_->Emit("kubelet_registration_served_again",
                    {{"resource", e->resource->name()}, {"kubelet_holds_it", reached_current}});
    }
    if (reached_current) {
      // Served again while the kubelet was answering, and the kubelet's
      // dial-back reached the new server: it holds the socket as served
      // now. Registering again there is refused by a 1.37 kubelet ("device
      // plugin already connected"), again and again.
      LOG(INFO) << "resource " << e->resource->name()
                << ": served again during registration; the kubelet dialled the new server";
    }
    if (s.ok() && e->served != served && !reached_current) {
      // Served again while the kubelet was answering, and its dial-back
      // reached the old server: register once more, toward the new one.
      LOG(INFO) << "resource " << e->resource->name()
                << ": served again during registration; registering again";
    } else if (s.ok()) {
      const FileId with = reached.value_or(kubelet);
      if (with != kubelet) {
        // Recording the old kubelet.sock here had the next pass take the
        // new one for a restart and register again, which a 1.37 kubelet
        // refuses ("device plugin already connected") for good.
        LOG(INFO) << "resource " << e->resource->name() << ": the kubelet restarted while this "
                  << "registration was on its way; registered with the new one";
      }
      // The time from a kubelet's start (its new socket) to this resource
      // registered with it: for kubelets that started while dpproxy ran.
      const absl::Time kubelet_start = absl::FromUnixNanos(with.ctime_ns);
      if (telemetry_ != nullptr && e->registered_with != with && kubelet_start > started_) {
        telemetry_->ObserveRegistration(e->resource->name(), absl::Now() - kubelet_start);
      }
      e->registered_with = with;
      ++e->registrations;
      e->dropped = false;
      e->registered_options = std::move(options);
      e->backoff = absl::ZeroDuration();
      e->retry_at = absl::InfinitePast();
    } else {
      ScheduleRetryLocked(e, s, kubelet_replaced, not_serving);
    }
  }
  wake_();
}

std::vector<HealthCheck> Registrar::RegistrationChecks() {
  const std::optional<FileId> kubelet = StatFileId(KubeletSocketPath(kubelet_));
  const bool watcher = kubelet_.registration == KubeletRegistration::kPluginWatcher;
  const absl::Time now = absl::Now();
  std::vector<HealthCheck> checks;
  absl::MutexLock lock(&mu_);
  for (const auto& e : slots_) {
    HealthCheck c;
    c.name = absl::StrCat("registered:", e->resource->name());
    if (watcher) {
      c.ok = !e->endpoint->negotiated().empty();
      if (!c.ok) c.reason = "the kubelet's plugin watcher has not called back yet";
    } else {
      c.ok = kubelet.has_value() && e->registered_with == kubelet && !e->dropped;
      if (c.ok) {
      } else if (e->registered_with == kubelet && kubelet.has_value()) {
        c.reason = "the kubelet ended its stream; registering again";
      } else if (!kubelet.has_value()) {
        c.reason = absl::StrCat("no kubelet socket at ", KubeletSocketPath(kubelet_));
      } else if (e->registering) {
        c.reason = "registering with the kubelet";
      } else if (e->retry_at > now) {
        c.reason = absl::StrCat("the last registration failed; retrying in ",
                                absl::FormatDuration(absl::Ceil(e->retry_at - now,
                                                                absl::Milliseconds(1))));
      } else {
        c.reason = "not registered with the kubelet yet";
      }
    }
    checks.push_back(std::move(c));
  }
  return checks;
}

}  // namespace dpproxy
