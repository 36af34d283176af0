#include "proxy/server/saver.h"

#include <malloc.h>

#include <algorithm>

#include <glog/logging.h>

#include "absl/time/clock.h"
#include "proxy/util/files.h"
#include "proxy/util/thread_name.h"

namespace dpproxy {

void Saver::Start() {
  {
    absl::MutexLock lock(&wake_mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] {
    NameThisThread("dpp-saver");
    Loop();
  });
}

void Saver::Stop() {
  {
    absl::MutexLock lock(&wake_mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Saver::Wake() {
  absl::MutexLock lock(&wake_mu_);
  wake_ = true;
}

void Saver::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&wake_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) -> bool {
        return wake_ || stop_;
      };
      wake_mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (stop_) return;
      wake_ = false;
    }
    absl::MutexLock pass(&pass_mu_);
    if (released_()) continue;  // the new dpproxy's to write now
    // Nothing below costs more than O(resources) unless something changed.
    const std::string fingerprint = reporter_->Fingerprint();
    const bool saved = SaveResources(fingerprint);
    // A change builds and drops copies as large as every device list (the
    // list read from the plugin, the saved resources, the status JSON,
    // gRPC's buffers for the kubelet's streams; at start, the state
    // loaded). glibc keeps freed memory in its arenas, so it is handed back
    // at the first change after a quiet spell, and again once things have
    // settled: some of those copies are dropped after this pass (at
    // 16 x 10,000 devices, 10 MB of the 41 MB otherwise held). While
    // changes keep coming, at most every kTrimEvery: under a stream of
    // Allocates every pass changes the counts, and memory handed back at
    // each was taken again, a page fault per page, by the next pass over
    // the allocations.
    const absl::Time now = absl::Now();
    if (WriteStatus(fingerprint) || saved) {
      if (!trim_due_ || now - trimmed_at_ >= kTrimEvery) Trim(now);
      changed_at_ = now;
      trim_due_ = true;
    } else if (trim_due_ && now - changed_at_ >= kTrimAfter) {
      Trim(now);
      trim_due_ = false;
    }
    // Freed elsewhere after the last trim: trimmed once settled. A kubelet
    // checkpoint of 16 x 10,000 devices read after the trim above kept
    // some 10 MB until the next change.
    if (const int64_t freed = freed_at_ns_.exchange(0); freed != 0) {
      const absl::Time at = absl::FromUnixNanos(freed);
      if (at > trimmed_at_) {
        changed_at_ = std::max(changed_at_, at);
        trim_due_ = true;
      }
    }
    passes_.Add();
  }
}

void Saver::Trim(absl::Time now) {
  ::malloc_trim(0);
  trimmed_at_ = now;
}

void Saver::SaveNow() {
  absl::MutexLock pass(&pass_mu_);
  saved_.clear();
  (void)SaveResources(reporter_->Fingerprint());
}

void Saver::Forget() {
  absl::MutexLock pass(&pass_mu_);
  saved_.clear();
  written_.clear();
}

bool Saver::SaveResources(const std::string& fingerprint) {
  if (keeper_ == nullptr || fingerprint == saved_) return false;
  // Failures are logged and counted.
  if (keeper_->SetResourcesToSave(reporter_->SavedResources()).ok()) saved_ = fingerprint;
  return true;
}

bool Saver::WriteStatus(const std::string& fingerprint) {
  if (options_.status_file.empty() || fingerprint == written_) return false;
  const absl::Time now = absl::Now();
  if (status_failing_ && now < status_retry_at_) return false;
  // Built from values at least as new as `fingerprint`: a change after it
  // was taken changes the next one, so nothing is missed.
  const std::string text = StatusFileText(reporter_->Status());
  const std::string& path = options_.status_file;
  if (absl::Status s = WriteFileAtomic(path, text, 0640); !s.ok()) {
    LOG(WARNING) << "cannot write the status file " << path << ": " << s.message()
                 << "; trying again in a minute";
    if (!status_failing_) {
      events_->Emit("status_write_failed", {{"path", path}, {"error", std::string(s.message())}});
    }
    status_failing_ = true;
    status_retry_at_ = now + absl::Minutes(1);
    return true;
  }
  if (status_failing_) {
    LOG(INFO) << "the status file " << path << " is written again";
    status_failing_ = false;
  }
  written_ = fingerprint;
  return true;
}

}  // namespace dpproxy
