// apiserver_sim: the Kubernetes API server as dpproxy's DRA mode uses it,
// for trying DRA mode and testing drivers without a cluster. See
// apiserver_sim.h for what it serves and checks.
#include <signal.h>

#include <iostream>

#include <gflags/gflags.h>

#include "absl/strings/str_split.h"
#include "proxy/cli/cli.h"
#include "tools/apiserver_sim/apiserver_sim.h"

DEFINE_string(listen, "127.0.0.1:0", "HOST:PORT to serve on (port 0: any free port, printed).");
DEFINE_string(cert, "", "PEM certificate for HTTPS (with --key). Empty: plain HTTP.");
DEFINE_string(key, "", "PEM private key of --cert.");
DEFINE_string(token, "", "Bearer token every request must carry. Empty: none required.");
DEFINE_string(versions, "v1",
              "resource.k8s.io versions served, newest first, comma-separated (v1, v1beta2,\n"
              "v1beta1): what discovery at /apis/resource.k8s.io answers.");
DEFINE_string(events, "", "Append one JSON line per request to this file. Empty: none.");

int main(int argc, char** argv) {
  gflags::SetUsageMessage(R"(apiserver_sim [flags]

A stand-in for the Kubernetes API server, as far as a DRA driver uses it:
discovery of resource.k8s.io, ResourceSlices (list with fieldSelector on
spec.nodeName and spec.driver, create, get, update with resourceVersion,
delete) and ResourceClaims (create, get, PUT .../status), answering errors
as Kubernetes Status objects, and refusing the slices the real server would
(more than 128 devices, names that are not DNS labels, a pool without name,
generation or slice count). Objects live in memory. SIGTERM or SIGINT stop it.

Example:
  apiserver_sim --listen=127.0.0.1:6443 --token=t --versions=v1,v1beta1
  curl -H 'Authorization: Bearer t' http://127.0.0.1:6443/apis/resource.k8s.io
)");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  dpproxy::sim::ApiServerSim::Options o;
  const size_t colon = FLAGS_listen.rfind(':');
  if (colon == std::string::npos) {
    std::cerr << "apiserver_sim: --listen=" << FLAGS_listen << " is not HOST:PORT\n";
    return 2;
  }
  o.host = FLAGS_listen.substr(0, colon);
  try {
    o.port = std::stoi(FLAGS_listen.substr(colon + 1));
  } catch (...) {
    std::cerr << "apiserver_sim: --listen=" << FLAGS_listen << ": the port is not a number\n";
    return 2;
  }
  o.cert_file = FLAGS_cert;
  o.key_file = FLAGS_key;
  o.token = FLAGS_token;
  o.versions = absl::StrSplit(FLAGS_versions, ',', absl::SkipEmpty());
  for (const std::string& v : o.versions) {
    if (v != "v1" && v != "v1beta2" && v != "v1beta1") {
      std::cerr << "apiserver_sim: --versions: \"" << v << "\" is not v1, v1beta2 or v1beta1\n";
      return 2;
    }
  }
  dpproxy::BlockTerminationSignals();
  dpproxy::sim::ApiServerSim api(o);
  if (!FLAGS_events.empty()) {
    if (absl::Status s = api.events().OpenFile(FLAGS_events); !s.ok()) {
      std::cerr << "apiserver_sim: " << s.message() << "\n";
      return 2;
    }
  }
  if (absl::Status s = api.Start(); !s.ok()) {
    std::cerr << "apiserver_sim: " << s.message() << "\n";
    return 1;
  }
  std::cout << "apiserver_sim: serving " << api.url() << std::endl;
  int sig = 0;
  do {
    sig = dpproxy::WaitForTerminationSignal();
  } while (sig == SIGHUP);
  api.Stop();
  return 0;
}
