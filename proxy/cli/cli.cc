#include "proxy/cli/cli.h"

#include <algorithm>
#include <cstdio>

#include <gflags/gflags.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proxy/version/version.h"

namespace dpproxy {

std::string FlagsHelp(const std::vector<std::string>& file_substrings) {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  std::sort(flags.begin(), flags.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::string out;
  for (const auto& f : flags) {
    bool mine = false;
    for (const std::string& s : file_substrings) {
      if (absl::StrContains(f.filename, s)) mine = true;
    }
    if (!mine) continue;
    std::string def = f.type == "string" ? absl::StrCat("\"", f.default_value, "\"")
                                         : f.default_value;
    absl::StrAppend(&out, "  --", f.name, " (", f.type, ", default ", def, ")\n");
    for (absl::string_view line : absl::StrSplit(f.description, '\n')) {
      absl::StrAppend(&out, "      ", line, "\n");
    }
  }
  return out;
}

bool WantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (a == "--help" || a == "-h" || a == "-help" || a == "help" || a == "--helpfull") {
      return true;
    }
  }
  return false;
}

void ShiftArgs(int* argc, char** argv) {
  if (*argc < 2) return;
  for (int i = 1; i + 1 < *argc; ++i) argv[i] = argv[i + 1];
  --*argc;
  argv[*argc] = nullptr;
}

}  // namespace dpproxy

#include <signal.h>

namespace dpproxy {

absl::StatusOr<absl::Duration> ParseFlagDuration(const char* name, const std::string& value) {
  absl::Duration d;
  if (!absl::ParseDuration(value, &d) || d < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, "=", value, " is not a duration (examples: 500ms, 10s, 5m)"));
  }
  return d;
}

namespace {

// The flag an argument names ("" if it is not a flag): "--name=value",
// "--name", "-name".
std::string FlagName(const char* arg) {
  if (arg[0] != '-') return "";
  std::string name(arg + (arg[1] == '-' ? 2 : 1));
  return name.substr(0, name.find('='));
}

bool KnownFlag(const std::string& name) {
  gflags::CommandLineFlagInfo info;
  if (gflags::GetCommandLineFlagInfo(name.c_str(), &info)) return true;
  // --noNAME for a boolean NAME.
  return absl::StartsWith(name, "no") &&
         gflags::GetCommandLineFlagInfo(name.substr(2).c_str(), &info) && info.type == "bool";
}

}  // namespace

bool ParseFlags(const char* program, int* argc, char*** argv) {
  NormalizeFlagDashes(*argc, *argv);
  for (int i = 1; i < *argc; ++i) {
    const char* arg = (*argv)[i];
    if (std::string(arg) == "--") break;
    const std::string name = FlagName(arg);
    if (name == "version") {
      printf("%s %s (commit %s)\n", program, kDpproxyVersion, kDpproxyCommit);
      exit(0);
    }
    if (!name.empty() && !KnownFlag(name)) {
      // gflags itself would exit 1; every dpproxy tool exits 2 on bad usage.
      fprintf(stderr, "%s: unknown flag \"%s\"; see %s --help\n", program, arg, program);
      return false;
    }
  }
  gflags::SetUsageMessage(absl::StrCat("see ", program, " --help"));
  gflags::SetVersionString(kDpproxyVersion);
  gflags::ParseCommandLineFlags(argc, argv, true);
  if (*argc > 1) {
    fprintf(stderr, "%s: unexpected argument \"%s\"; see %s --help\n", program, (*argv)[1],
            program);
    return false;
  }
  return true;
}

void NormalizeFlagDashes(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* a = argv[i];
    if (a[0] != '-' || a[1] != '-') continue;
    for (char* p = a + 2; *p != '\0' && *p != '='; ++p) {
      if (*p == '-') *p = '_';
    }
  }
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTerminationSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGUSR2);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

}  // namespace dpproxy
