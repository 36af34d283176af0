#include "proxy/server/housekeeping.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/util/thread_name.h"

namespace dpproxy {

void Housekeeping::Start(Parts parts) {
  p_ = std::move(parts);
  {
    absl::MutexLock lock(&mu_);
    stop_ = false;
  }
  housekeeping_ = std::thread([this] {
    NameThisThread("dpp-housekeep");
    Loop();
  });
  if (p_.reconciler) {
    checkpoint_ = std::thread([this] {
      NameThisThread("dpp-checkpoint");
      CheckpointLoop();
    });
  }
}

void Housekeeping::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (housekeeping_.joinable()) housekeeping_.join();
  if (checkpoint_.joinable()) checkpoint_.join();
}

void Housekeeping::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

bool Housekeeping::Await(bool* flag, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, flag]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> bool {
    return *flag || stop_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (stop_) return false;
  *flag = false;
  return true;
}

void Housekeeping::Loop() {
  for (;;) {
    // Once a second at most without a wake-up (the stat fallback), sooner
    // when a registration is due for a retry.
    const absl::Duration wait =
        std::min(absl::Seconds(1), std::max(absl::ZeroDuration(), next_retry_ - absl::Now()));
    if (!Await(&wake_, wait)) return;
    const absl::Time now = absl::Now();
    const std::vector<ServedResource*> served = p_.table->All();
    for (ServedResource* e : served) e->resource->Tick(now);
    p_.statics->Tick(served);
    if (p_.shared_ids) p_.shared_ids->Check();
    // Before a new resource is registered: its first list already shows
    // what it must not hand out.
    if (p_.withheld) p_.withheld->Apply();
    const KubeletSide::PassResult pass = p_.side->Pass(now);
    next_retry_ = pass.next_retry;
    std::optional<Reconciler::RestartSeen> seen;
    if (p_.reconciler && pass.kubelet_restarted) {
      seen = p_.reconciler->NoteKubeletRestart(*pass.kubelet_restarted);
    }
    if (p_.handover) p_.handover->CheckProgress(now);
    {
      absl::MutexLock lock(&mu_);
      checkpoint_wake_ = true;
      if (seen.has_value()) restarts_seen_.push_back(*std::move(seen));
    }
    p_.saver->Wake();
    passes_.Add();
    pass_at_ns_ = absl::ToUnixNanos(absl::Now());
    if (p_.after_pass) p_.after_pass();
  }
}

void Housekeeping::CheckpointLoop() {
  for (;;) {
    if (!Await(&checkpoint_wake_, absl::Seconds(1))) return;
    std::vector<Reconciler::RestartSeen> restarts;
    {
      absl::MutexLock lock(&mu_);
      restarts.swap(restarts_seen_);
    }
    for (const Reconciler::RestartSeen& seen : restarts) p_.reconciler->OnKubeletRestart(seen);
    p_.reconciler->CheckCheckpoint();
  }
}

HealthCheck Housekeeping::Liveness() const {
  constexpr absl::Duration kStuck = absl::Seconds(30);
  HealthCheck c;
  c.name = "housekeeping";
  const int64_t at = pass_at_ns_.load();
  const absl::Duration since = absl::Now() - absl::FromUnixNanos(at);
  c.ok = at != 0 && since < kStuck;
  if (!c.ok) {
    c.reason = at == 0 ? "the housekeeping thread has not completed a pass"
                       : absl::StrCat("the housekeeping thread last completed a pass ",
                                      absl::FormatDuration(absl::Trunc(since, absl::Seconds(1))),
                                      " ago (it runs at least once a second)");
  }
  return c;
}

}  // namespace dpproxy
