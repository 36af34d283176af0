// apiserver_sim: the Kubernetes API server as dpproxy's DRA mode uses it,
// for trying DRA mode and testing drivers without a cluster. See
// apiserver_sim.h for what it serves and checks.
#include <signal.h>

#include <iostream>

#include <gflags/gflags.h>

#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "proxy/cli/cli.h"
#include "proxy/kube/kube_client.h"
#include "tools/apiserver_sim/apiserver_sim.h"
#include "tools/apiserver_sim/scheduler.h"

DEFINE_string(listen, "127.0.0.1:0", "HOST:PORT to serve on (port 0: any free port, printed).");
DEFINE_string(cert, "", "PEM certificate for HTTPS (with --key). Empty: plain HTTP.");
DEFINE_string(key, "", "PEM private key of --cert.");
DEFINE_string(token, "", "Bearer token every request must carry. Empty: none required.");
DEFINE_string(versions, "v1",
              "resource.k8s.io versions served, newest first, comma-separated (v1, v1beta2,\n"
              "v1beta1): what discovery at /apis/resource.k8s.io answers.");
DEFINE_string(latency, "0s",
              "Answer every request this late (an overloaded or hostile API server), e.g. 15s.");
DEFINE_string(nodes, "",
              "Nodes served at /api/v1/nodes/NAME, as NAME=KUBELET_VERSION, comma-separated\n"
              "(e.g. node-1=v1.36.2): their status.nodeInfo.kubeletVersion.");
DEFINE_string(events, "", "Append one JSON line per request to this file. Empty: none.");
DEFINE_string(server, "", "[claim] The API server's URL (what serve printed).");
DEFINE_string(ca, "", "[claim] PEM CA of an https server.");
DEFINE_string(claim_namespace, "default", "[claim] The claim's namespace.");
DEFINE_string(name, "", "[claim] The claim's name.");
DEFINE_string(driver, "", "[claim] The DRA driver the devices belong to.");
DEFINE_string(pool, "", "[claim] The pool the devices are in, e.g. node-1/vendor.com-gpu.");
DEFINE_string(devices, "", "[claim] Device names, comma-separated (with --pool); or --count.");
DEFINE_int32(count, 0,
             "[claim] Pick this many free devices of --driver from the published\n"
             "ResourceSlices, as the scheduler does (newest pool generation only,\n"
             "devices in other claims' allocations skipped), from --pool if given\n"
             "and --node if given.");
DEFINE_string(node, "", "[claim] With --count: only devices of this node's slices.");
DEFINE_string(request, "gpu", "[claim] The claim's request the devices are allocated for.");

namespace {

constexpr char kUsage[] = R"(apiserver_sim [serve] [flags]
apiserver_sim claim --server=URL --name=N --driver=D --pool=P --devices=A,B [--token=T]
apiserver_sim claim --server=URL --name=N --driver=D --count=K [--pool=P] [--node=X]

A stand-in for the Kubernetes API server, as far as a DRA driver uses it:
discovery of resource.k8s.io, ResourceSlices (list and watch with
fieldSelector on spec.nodeName and spec.driver, create, also with
generateName; get, update with resourceVersion, delete; in JSON or in the
Kubernetes protobuf client-go sends), ResourceClaims (create, also with
generateName; get, delete, PUT
.../status) and DeviceClasses (create, get, list), answering errors as
Kubernetes Status objects, and refusing the slices the real server would
(more than 128 devices, names that are not DNS labels, a pool without name,
generation or slice count) and a DeviceClass whose extendedResourceName is
not an extended resource name. Objects live in memory. SIGTERM or SIGINT
stop it.

claim plays the scheduler: it creates a ResourceClaim and writes its
allocation (those devices of that pool, or --count free devices picked from
the published slices, for --request), then prints NAMESPACE/NAME/UID, as
`kubelet_sim prepare --claims` takes it. It works against a real API server
too.

Example:
  apiserver_sim --listen=127.0.0.1:6443 --token=t --versions=v1,v1beta1
  apiserver_sim claim --server=http://127.0.0.1:6443 --token=t --name=train \
      --driver=gpu.vendor.com --pool=node-1/vendor.com-gpu --devices=gpu-0,gpu-1
)";

// The scheduler's part, for trying a DRA driver by hand: a claim created
// and its allocation written, as kube-scheduler does.
int Claim() {
  if (FLAGS_server.empty() || FLAGS_name.empty() || FLAGS_driver.empty() ||
      FLAGS_devices.empty() == (FLAGS_count <= 0) || (!FLAGS_devices.empty() && FLAGS_pool.empty())) {
    std::cerr << "apiserver_sim claim: --server, --name and --driver are required, with either "
                 "--pool and --devices or --count (> 0)\n";
    return 2;
  }
  dpproxy::KubeConfig c;
  c.server = FLAGS_server;
  c.token = FLAGS_token;
  c.ca_file = FLAGS_ca;
  c.source = "flags";
  absl::StatusOr<std::unique_ptr<dpproxy::KubeClient>> client = dpproxy::KubeClient::Create(c);
  if (!client.ok()) {
    std::cerr << "apiserver_sim claim: " << client.status().message() << "\n";
    return 2;
  }
  dpproxy::sim::ClaimAllocation a;
  a.namespace_ = FLAGS_claim_namespace;
  a.name = FLAGS_name;
  a.driver = FLAGS_driver;
  a.request = FLAGS_request;
  a.pool = FLAGS_pool;
  a.node = FLAGS_node;
  a.count = FLAGS_count;
  a.devices = absl::StrSplit(FLAGS_devices, ',', absl::SkipEmpty());
  absl::StatusOr<nlohmann::json> claim = dpproxy::sim::CreateAllocatedClaim(client->get(), a);
  if (!claim.ok()) {
    std::cerr << "apiserver_sim claim: " << claim.status().message() << "\n";
    return 1;
  }
  std::cout << FLAGS_claim_namespace << "/" << FLAGS_name << "/"
            << (*claim)["metadata"]["uid"].get<std::string>() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string command = "serve";
  if (argc >= 2 && argv[1][0] != '-' && std::string(argv[1]) != "help") {
    command = argv[1];
    dpproxy::ShiftArgs(&argc, argv);
  }
  if (dpproxy::WantsHelp(argc, argv)) {
    std::cout << kUsage << "\nFlags:\n" << dpproxy::FlagsHelp({"apiserver_sim/main.cc"});
    return 0;
  }
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (command == "claim") return Claim();
  if (command != "serve") {
    std::cerr << "apiserver_sim: unknown subcommand \"" << command << "\" (serve, claim)\n";
    return 2;
  }
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
  absl::Duration latency;
  if (!absl::ParseDuration(FLAGS_latency, &latency) || latency < absl::ZeroDuration()) {
    std::cerr << "apiserver_sim: --latency=" << FLAGS_latency << " is not a duration\n";
    return 2;
  }
  std::vector<std::pair<std::string, std::string>> nodes;
  for (absl::string_view n : absl::StrSplit(FLAGS_nodes, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(n, absl::MaxSplits('=', 1));
    if (kv.first.empty() || kv.second.empty()) {
      std::cerr << "apiserver_sim: --nodes: \"" << n << "\" is not NAME=KUBELET_VERSION\n";
      return 2;
    }
    nodes.push_back(std::move(kv));
  }
  dpproxy::BlockTerminationSignals();
  dpproxy::sim::ApiServerSim api(o);
  api.SetLatency(latency);
  for (const auto& [name, version] : nodes) api.PutNode(name, version);
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
