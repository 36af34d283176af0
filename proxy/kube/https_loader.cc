#include "proxy/kube/https_loader.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proxy/kube/https_abi.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

// Where the module sits in the source tree (its Bazel package): runfiles
// mirror it.
constexpr char kRunfilesPath[] = "dpproxy/proxy/kube";

}  // namespace

const char* HttpsModuleAbi() { return https::kHttpsAbi; }

std::vector<std::string> HttpsModuleCandidates() {
  std::vector<std::string> out;
  // Where the executable was started from, even once it was replaced on
  // disk (an upgrade installs a new one beside a module of its own build).
  if (const std::optional<std::string> found = ExecutableOf("self"); found.has_value()) {
    const std::string& exe = *found;
    const std::string dir = DirName(exe);
    out.push_back(JoinPath(dir, kHttpsModuleName));
    out.push_back(JoinPath(DirName(dir), JoinPath("lib/dpproxy", kHttpsModuleName)));
    out.push_back(JoinPath(exe + ".runfiles", JoinPath(kRunfilesPath, kHttpsModuleName)));
  }
  if (const char* runfiles = ::getenv("RUNFILES_DIR"); runfiles != nullptr && *runfiles != '\0') {
    out.push_back(JoinPath(runfiles, JoinPath(kRunfilesPath, kHttpsModuleName)));
  }
  return out;
}

absl::StatusOr<const https::Module*> LoadHttpsModule(const std::string& path,
                                                     const std::string& abi) {
  // Never unloaded: the module serves the process to its end.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load dpproxy's HTTPS module ", path, ": ", why != nullptr ? why : "unknown"));
  }
  using AbiFn = const char* (*)();
  using ModuleFn = const https::Module* (*)();
  auto abi_fn = reinterpret_cast<AbiFn>(::dlsym(handle, "dpproxy_https_abi"));
  auto module_fn = reinterpret_cast<ModuleFn>(::dlsym(handle, "dpproxy_https_module"));
  if (abi_fn == nullptr || module_fn == nullptr) {
    ::dlclose(handle);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a dpproxy HTTPS module (it does not export ",
                     "dpproxy_https_abi and dpproxy_https_module)"));
  }
  const std::string theirs = abi_fn();
  if (theirs != abi) {
    ::dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(
        "the HTTPS module ", path, " comes from another build of dpproxy (its ABI mark ",
        theirs, ", this dpproxy's ", abi, "): install the two together"));
  }
  return module_fn();
}

absl::StatusOr<const https::Module*> HttpsModule() {
  static absl::once_flag once;
  static absl::StatusOr<const https::Module*>* loaded = nullptr;
  absl::call_once(once, [] {
    const std::vector<std::string> candidates = HttpsModuleCandidates();
    for (const std::string& path : candidates) {
      if (::access(path.c_str(), F_OK) != 0) continue;
      loaded = new absl::StatusOr<const https::Module*>(LoadHttpsModule(path, HttpsModuleAbi()));
      return;
    }
    loaded = new absl::StatusOr<const https::Module*>(absl::FailedPreconditionError(absl::StrCat(
        "dpproxy's HTTPS module ", kHttpsModuleName,
        " (the Kubernetes API client's TLS) is not installed; looked at ",
        candidates.empty() ? "nothing (no /proc/self/exe)" : absl::StrJoin(candidates, ", "))));
  });
  return *loaded;
}

}  // namespace dpproxy
