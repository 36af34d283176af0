#include "proxy/server/redialer.h"

#include <sys/stat.h>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "backends/connect.h"
#include "proxy/util/files.h"
#include "proxy/util/thread_name.h"

namespace dpproxy {

Redialer::Redialer(Options options, WorkQueue* workers, EventLog* events, Attach attach,
                   HasBackend has_backend)
    : options_(std::move(options)),
      workers_(workers),
      events_(events),
      attach_(std::move(attach)),
      has_backend_(std::move(has_backend)) {}

Redialer::~Redialer() { Stop(); }

void Redialer::Start(std::vector<Remembered> remembered) {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable() || stopping_ || remembered.empty()) return;
  for (const Remembered& r : remembered) {
    Report& report = reports_[r.resource];
    report.endpoint = r.endpoint;
    // A plugin that is not running is known at once (never a blocking
    // look): it registers when it starts.
    const absl::Status live = CheckEndpoint(r.endpoint);
    report.outcome = live.ok() ? Outcome::kDialling : Outcome::kGone;
    report.error = std::string(live.message());
  }
  remembered_ = std::move(remembered);
  thread_ = std::thread([this] {
    NameThisThread("dpp-redialer");
    Run();
  });
}

void Redialer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool Redialer::SettledLocked() const {
  for (const auto& [name, r] : reports_) {
    if (r.outcome == Outcome::kDialling) return false;
  }
  return true;
}

bool Redialer::settled() {
  absl::MutexLock lock(&mu_);
  return SettledLocked();
}

bool Redialer::WaitSettled(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(this, &Redialer::SettledLocked), timeout);
}

std::map<std::string, Redialer::Report> Redialer::reports() {
  absl::MutexLock lock(&mu_);
  return reports_;
}

absl::Status Redialer::CheckEndpoint(const std::string& endpoint) const {
  // The state file is dpproxy's own, but a path in it is dialled only
  // where a plugin could have registered: inside the plugin directory,
  // and a socket there (never through a link).
  if (!IsSameOrInside(DirName(endpoint), options_.plugin_dir)) {
    return absl::FailedPreconditionError(
        absl::StrCat(endpoint, " is not inside the plugin directory ", options_.plugin_dir));
  }
  struct stat st;
  if (::lstat(endpoint.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("its socket ", endpoint, " is gone"));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(endpoint, " is not a socket"));
  }
  if (!SomeoneListens(endpoint)) {
    return absl::UnavailableError(
        absl::StrCat("nobody listens on ", endpoint, " (the plugin is not running)"));
  }
  return absl::OkStatus();
}

bool Redialer::StartRound(const std::vector<Remembered>& round, bool last) {
  for (const Remembered& r : round) {
    if (has_backend_(r.resource)) {
      // It registered by itself (it watches kubelet.sock).
      Finish(r.resource, Outcome::kBack, "");
      continue;
    }
    if (absl::Status s = CheckEndpoint(r.endpoint); !s.ok()) {
      Finish(r.resource, Outcome::kGone, std::string(s.message()));
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      ++in_flight_;
    }
    const bool queued = workers_->Submit([this, r, last] {
      Dial(r);
      absl::MutexLock lock(&mu_);
      --in_flight_;
      Report& report = reports_[r.resource];
      if (last && report.outcome == Outcome::kDialling) report.outcome = Outcome::kGone;
    });
    if (!queued) {
      absl::MutexLock lock(&mu_);
      --in_flight_;
      return false;  // stopping
    }
  }
  return true;
}

void Redialer::Run() {
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.settle);
  }
  for (int attempt = 1; attempt <= options_.attempts; ++attempt) {
    std::vector<Remembered> round;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      for (const Remembered& r : remembered_) {
        if (reports_[r.resource].outcome == Outcome::kDialling) round.push_back(r);
      }
    }
    if (round.empty()) return;
    const bool last = attempt == options_.attempts;
    if (!StartRound(round, last)) return;
    absl::MutexLock lock(&mu_);
    auto round_over = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || in_flight_ == 0;
    };
    mu_.Await(absl::Condition(&round_over));
    if (stopping_ || last) break;
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.retry_every);
  }
  // Those still not back are logged once.
  for (const auto& [name, report] : reports()) {
    if (report.outcome != Outcome::kGone || report.error.empty()) continue;
    LOG(WARNING) << "resource " << name << ": the plugin at " << report.endpoint
                 << " that served it before this dpproxy started is not back: " << report.error
                 << "; it is served again when a plugin registers";
    events_->Emit("backend_redial_failed",
                  {{"resource", name}, {"endpoint", report.endpoint}, {"error", report.error}});
  }
}

void Redialer::Dial(const Remembered& r) {
  absl::StatusOr<std::shared_ptr<Backend>> b =
      ConnectBackend(r.backend_resource, r.endpoint, r.api, options_.dial_timeout,
                     options_.max_list_bytes, r.options);
  if (!b.ok()) {
    absl::MutexLock lock(&mu_);
    reports_[r.resource].error = std::string(b.status().message());
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      (*b)->Stop();
      return;
    }
  }
  if (has_backend_(r.resource)) {  // the plugin registered meanwhile: it wins
    (*b)->Stop();
    return Finish(r.resource, Outcome::kBack, "");
  }
  if (absl::Status s = attach_(*b); !s.ok()) {
    (*b)->Stop();
    return Finish(r.resource, Outcome::kGone, std::string(s.message()));
  }
  LOG(INFO) << "resource " << r.resource << ": dialled its plugin again at " << r.endpoint
            << " (" << ApiWireVersion(r.api)
            << "), where it served before this dpproxy started";
  events_->Emit("backend_redialled", {{"resource", r.resource},
                                      {"endpoint", r.endpoint},
                                      {"api_version", std::string(ApiWireVersion(r.api))}});
  Finish(r.resource, Outcome::kBack, "");
}

void Redialer::Finish(const std::string& resource, Outcome outcome, const std::string& error) {
  absl::MutexLock lock(&mu_);
  Report& report = reports_[resource];
  report.outcome = outcome;
  report.error = error;
}

}  // namespace dpproxy
