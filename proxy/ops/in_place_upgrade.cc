#include "proxy/ops/in_place_upgrade.h"

#include <limits.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cstdlib>

#include <glog/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dpproxy {

std::vector<std::string> UpgradeArgv(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (i > 0 && (a == "--takeover" || a == "-takeover" ||
                  absl::StartsWith(a, "--takeover=") || absl::StartsWith(a, "-takeover="))) {
      continue;
    }
    out.push_back(a);
  }
  if (!out.empty()) out.insert(out.begin() + 1, "--takeover");
  return out;
}

std::string AbsoluteProgramPath(const std::string& argv0) {
  if (argv0.empty() || argv0.front() == '/') return argv0;
  if (argv0.find('/') != std::string::npos) {
    char cwd[PATH_MAX];
    if (::getcwd(cwd, sizeof(cwd)) == nullptr) return argv0;
    return absl::StrCat(cwd, "/", argv0);
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path == nullptr ? "" : path, ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", argv0);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return argv0;
}

InPlaceUpgrade::~InPlaceUpgrade() {
  stop_ = true;
  if (watcher_.joinable()) watcher_.join();
  absl::MutexLock lock(&mu_);
  if (child_ != nullptr) child_->Detach();  // the new dpproxy runs on
}

absl::Status InPlaceUpgrade::Start() {
  absl::MutexLock lock(&mu_);
  if (child_running_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("an upgrade is in progress already (pid ", child_->pid(), ")"));
  }
  if (watcher_.joinable()) watcher_.join();
  ChildSpec spec;
  spec.argv = UpgradeArgv(argv_);
  // Its own process group: a SIGINT to this one's terminal must not reach
  // it. systemd's watchdog variables name this process: the new one sends
  // keep-alives as the main process it becomes.
  spec.unset_env = {"WATCHDOG_PID"};
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(spec);
  if (!child.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the new dpproxy: ", child.status().message()));
  }
  child_ = *std::move(child);
  child_running_ = true;
  LOG(INFO) << "upgrade: started " << spec.argv[0] << " (pid " << child_->pid()
            << ") to take over from this dpproxy";
  watcher_ = std::thread([this, c = child_.get()] { Watch(c); });
  return absl::OkStatus();
}

void InPlaceUpgrade::Watch(ChildProcess* child) {
  while (!stop_.load()) {
    std::optional<int> status = child->Wait(absl::Milliseconds(500));
    if (!status.has_value()) continue;
    // It ended while this one still runs: it did not take over (or took the
    // state and gave it back); this one serves on.
    LOG(ERROR) << "upgrade: the new dpproxy (pid " << child->pid() << ") "
               << ChildProcess::DescribeExit(*status)
               << " before it took over; this dpproxy goes on serving";
    child_running_ = false;
    return;
  }
}

void NotifyMainProcess() {
  if (std::getenv("NOTIFY_SOCKET") == nullptr) return;
  const std::string message = absl::StrCat("MAINPID=", ::getpid(), "\nREADY=1");
  if (int r = sd_notify(/*unset_environment=*/0, message.c_str()); r < 0) {
    LOG(WARNING) << "sd_notify(MAINPID) failed: " << r;
    return;
  }
  if (int r = sd_notify_barrier(/*unset_environment=*/0, 5 * 1000 * 1000); r < 0) {
    LOG(WARNING) << "systemd did not confirm the new main process within 5 s: " << r;
  }
  LOG(INFO) << "told systemd this process (pid " << ::getpid() << ") is the service's main one";
}

}  // namespace dpproxy
