#include "proxy/daemon/commands.h"

#include <errno.h>
#include <signal.h>

#include <algorithm>
#include <iostream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/cli/cli.h"
#include "proxy/status/status_model.h"
#include "proxy/util/files.h"

namespace dpproxy {

namespace {

// Whether process `pid` runs a dpproxy binary (its executable's name
// starts with "dpproxy": a pid from an old status file may be anyone's now).
bool IsDpproxy(int64_t pid) {
  const std::optional<std::string> path = ExecutableOf(absl::StrCat(pid));
  if (!path.has_value()) return false;
  return absl::StartsWith(path->substr(path->rfind('/') + 1), "dpproxy");
}

}  // namespace

int PrintStatus(const std::string& path, const std::string& output) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    std::cerr << "dpproxy: no status at " << path
              << " (is dpproxy running with this --status_file or --state_dir?): "
              << text.status().message() << "\n";
    return 1;
  }
  const Json json = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<ProxyStatus> st = StatusFromJson(json);
  if (json.is_discarded() || !st.ok()) {
    std::cerr << "dpproxy: " << path << " is not a status file"
              << (st.ok() ? "" : absl::StrCat(" (", st.status().message(), ")")) << "\n";
    return 1;
  }
  if (output != "table" && output != "json") {
    std::cerr << "dpproxy: --output=" << output << " is not table or json\n";
    return 2;
  }
  std::cout << (output == "json" ? json.dump(2) + "\n" : StatusTable(*st));
  // As /readyz: a script can wait for dpproxy with `dpproxy status`.
  return st->not_ready.empty() ? 0 : kExitNotReady;
}

int WaitForRegistrationSocket(const std::string& plugin_dir, const std::string& wait_timeout) {
  absl::StatusOr<absl::Duration> timeout = ParseFlagDuration("wait_timeout", wait_timeout);
  if (!timeout.ok()) {
    std::cerr << "dpproxy: " << timeout.status().message() << "\n";
    return 2;
  }
  const std::string socket = JoinPath(plugin_dir, "kubelet.sock");
  const absl::Time deadline = absl::Now() + *timeout;
  for (;;) {
    if (SomeoneListens(socket)) {
      std::cout << "dpproxy: plugins can register at " << socket << "\n";
      return 0;
    }
    if (absl::Now() >= deadline) break;
    // A poll of a path, with nothing to be woken by: 50 ms apart.
    absl::SleepFor(std::min(absl::Milliseconds(50), deadline - absl::Now()));
  }
  std::cerr << "dpproxy: nothing serves plugin registrations at " << socket << " after "
            << absl::FormatDuration(*timeout) << " (is dpproxy running with this --plugin_dir?)\n";
  return 1;
}

int Reload(const std::string& path) {
  int64_t pid = 0;
  std::string from;
  if (absl::StatusOr<std::string> text = ReadFile(path); text.ok()) {
    absl::StatusOr<ProxyStatus> st =
        StatusFromJson(Json::parse(*text, nullptr, /*allow_exceptions=*/false));
    if (!st.ok() || st->pid <= 0) {
      std::cerr << "dpproxy: " << path << " is not a status file naming a process\n";
      return 1;
    }
    pid = st->pid;
    from = absl::StrCat("named by ", path);
  } else if (IsDpproxy(1)) {
    pid = 1;
    from = "PID 1";
  } else {
    std::cerr << "dpproxy: no status at " << path << " (" << text.status().message()
              << "), and PID 1 is not dpproxy; name the running one's --status_file or "
              << "--state_dir\n";
    return 1;
  }
  if (!IsDpproxy(pid)) {
    std::cerr << "dpproxy: process " << pid << " (" << from
              << ") is not a dpproxy (an old status file?); nothing was sent\n";
    return 1;
  }
  if (::kill(static_cast<pid_t>(pid), SIGHUP) != 0) {
    std::cerr << "dpproxy: cannot signal process " << pid << " (" << from
              << "): " << ErrnoText(errno) << "\n";
    return 1;
  }
  std::cout << "dpproxy (pid " << pid << ", " << from
            << ") re-reads its configuration; its log says what changed, or why the file "
               "was refused\n";
  return 0;
}

}  // namespace dpproxy
