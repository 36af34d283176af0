// File: https_loader.h
//
// Finds and loads the HTTPS module (https_module.h) once per process, the
// first time the Kubernetes API client needs it. It is looked for, in this
// order, where dpproxy's own executable (the real file, links resolved) is:
//
//   <exe dir>/dpproxy-https.so                       beside the executable
//   <exe dir>/../lib/dpproxy/dpproxy-https.so        the Debian package, the image
//   <exe>.runfiles/dpproxy/proxy/kube/dpproxy-https.so    a Bazel-built binary
//   $RUNFILES_DIR/dpproxy/proxy/kube/dpproxy-https.so     bazel run, bazel test
//
// The first file that exists is the one: it must be a dpproxy HTTPS module
// of this very build (its ABI mark), or loading fails and says why. A
// failure is kept and returned again; nothing retries behind the caller.
#ifndef DPPROXY_PROXY_KUBE_HTTPS_LOADER_H_
#define DPPROXY_PROXY_KUBE_HTTPS_LOADER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proxy/kube/https_module.h"

namespace dpproxy {

inline constexpr char kHttpsModuleName[] = "dpproxy-https.so";

// The module, loaded on the first call. kFailedPrecondition naming every
// place looked at if none holds it, or the file and the reason if it cannot
// be loaded or is of another build.
absl::StatusOr<const https::Module*> HttpsModule();

// The places HttpsModule looks, in order.
std::vector<std::string> HttpsModuleCandidates();

// Loads the module at `path` (not cached): for HttpsModule and tests.
// `abi`: the mark it must carry.
absl::StatusOr<const https::Module*> LoadHttpsModule(const std::string& path,
                                                     const std::string& abi);

// This build's ABI mark.
const char* HttpsModuleAbi();

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBE_HTTPS_LOADER_H_
