// File: apiserver_sim.h
//
// A stand-in for the Kubernetes API server, as far as DRA mode uses it
// (resource.k8s.io, KEP-4381): the resource.k8s.io group with the versions asked for
// (discovery at /apis/resource.k8s.io), cluster-scoped ResourceSlices
// (list and watch with a fieldSelector on spec.nodeName and spec.driver,
// create, with generateName too; get, update with optimistic concurrency,
// delete; bodies in JSON or, as client-go's generated clientset sends them,
// Kubernetes protobuf: k8s_protobuf.h), namespaced ResourceClaims
// (create, with generateName too; get, status, delete, a list across
// namespaces; or put in place by tests) and DeviceClasses (create, get,
// list), and Nodes (get, and update of metadata and spec such as taints
// with optimistic concurrency, the status kept as its kubelet wrote it:
// the kubelet's version in status.nodeInfo and the allocatable of its
// extended resources, for nodes a test has put). A real HTTPS server
// (cpp-httplib) with a bearer token, answering errors as Kubernetes Status
// objects with the real reasons (NotFound, AlreadyExists, Conflict,
// Invalid, Unauthorized). It checks what the real server would refuse in a
// ResourceSlice: more than 128 devices, a device name that is not a DNS
// label, a pool without name or generation, a nodeName or driver missing.
//
//   ApiServerSim api({.cert_file = c, .key_file = k, .token = "t"});
//   ASSERT_TRUE(api.Start().ok());
//   ... KubeClient at api.url() ...
#ifndef DPPROXY_TOOLS_APISERVER_SIM_APISERVER_SIM_H_
#define DPPROXY_TOOLS_APISERVER_SIM_APISERVER_SIM_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/events/event_log.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace dpproxy::sim {

class ApiServerSim {
 public:
  using Json = nlohmann::json;

  struct Options {
    std::string cert_file;  // with key_file: HTTPS; both empty: plain HTTP
    std::string key_file;
    std::string token;  // every request must carry "Bearer <token>"; "": none
    // resource.k8s.io versions served, newest first (the preferred one).
    std::vector<std::string> versions = {"v1"};
    std::string host = "127.0.0.1";
    int port = 0;  // 0: any free port
  };

  explicit ApiServerSim(Options options);
  ~ApiServerSim();

  // Listens (port() is known when it returns) and serves on a thread. A
  // Start after Stop listens on the same port again (the server came back).
  absl::Status Start();
  void Stop();

  // Faults of a real control plane. The next `times` requests whose method
  // is `method` ("" any) and whose path starts with `path_prefix` are
  // answered `code` with the API server's Status and reason (403 Forbidden,
  // 409 Conflict, 429 TooManyRequests, 500 InternalError, 503
  // ServiceUnavailable) and
  // change nothing.
  struct Fault {
    std::string method;
    std::string path_prefix;
    int code = 503;
    int times = 1;
  };
  void InjectFault(Fault fault);
  // The next request of `method` under `path_prefix` is answered `code`
  // with `body` as it is: a broken or hostile answer (wrong JSON types, a
  // huge document).
  void InjectAnswer(const std::string& method, const std::string& path_prefix, int code,
                    std::string body);
  // Every answer waits this long first (an overloaded server).
  void SetLatency(absl::Duration latency);
  int port() const { return port_; }
  std::string url() const;

  // A ResourceClaim as the scheduler left it (metadata.namespace and name
  // set; uid and resourceVersion filled in when missing).
  Json PutClaim(Json claim);
  // A Node as its kubelet reports it: status.nodeInfo.kubeletVersion is
  // `kubelet_version` (e.g. "v1.33.2").
  void PutNode(const std::string& name, const std::string& kubelet_version);
  // The node's status.allocatable for extended resources, as its kubelet
  // writes it at each node status update (quantities as strings: "4").
  // A node not put yet is put with no version.
  void SetNodeAllocatable(const std::string& name,
                          const std::map<std::string, int64_t>& allocatable);
  // The node as stored (null if there is none).
  Json Node(const std::string& name);
  // Every ResourceSlice stored, by name.
  std::map<std::string, Json> Slices();
  // Deletes every slice of a node, as a kubelet does when it starts.
  int DeleteSlicesOfNode(const std::string& node);
  // One event per request: method, path, code.
  EventLog& events() { return events_; }

 private:
  // A change of a ResourceSlice, for watchers: ADDED, MODIFIED or DELETED,
  // the object as it became (as it was, for DELETED), at resourceVersion rv.
  struct SliceEvent {
    int64_t rv;
    std::string type;
    Json object;
  };

  // Auth, injected faults and latency; true if it answered the request.
  bool PreRoute(const httplib::Request& req, httplib::Response& res);
  void Routes();
  void NodeRoutes();
  // The routes of one resource.k8s.io version ("v1").
  void SliceRoutes(const std::string& version);
  void ClaimRoutes(const std::string& version);
  void DeviceClassRoutes(const std::string& version);
  // "spec.nodeName=a,spec.driver=b" -> {{"spec.nodeName", "a"}, ...}, and
  // whether a slice has every field so.
  static std::map<std::string, std::string> ParseFieldSelector(const std::string& s);
  static bool SliceMatches(const Json& slice, const std::map<std::string, std::string>& selector);
  // Records a change of a slice for watchers (apiserver_sim_watch.cc).
  void NoteSlice(const std::string& type, const Json& slice) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GET .../resourceslices?watch=true: streams the changes of the slices
  // the fieldSelector picks, from the resourceVersion asked (410 Gone if
  // older than the history kept), or after the current ones as ADDED with
  // sendInitialEvents=true and a BOOKMARK marking their end, as the
  // reflector's watch-list asks; until timeoutSeconds or Stop().
  void ServeSliceWatch(const httplib::Request& req, httplib::Response& res,
                       const std::string& api_version);
  // Five characters for a generateName, as the API server's.
  std::string GeneratedSuffix();

  const Options options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  EventLog events_{"apiserver_sim"};

  absl::Mutex mu_;
  int64_t resource_version_ ABSL_GUARDED_BY(mu_) = 1000;
  std::map<std::string, Json> slices_ ABSL_GUARDED_BY(mu_);  // by name
  std::deque<SliceEvent> slice_events_ ABSL_GUARDED_BY(mu_);  // the newest, oldest first
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // watchers end their streams
  std::map<std::string, Json> claims_ ABSL_GUARDED_BY(mu_);  // by "ns/name"
  std::map<std::string, Json> device_classes_ ABSL_GUARDED_BY(mu_);  // by name
  std::map<std::string, Json> nodes_ ABSL_GUARDED_BY(mu_);  // by name
  std::vector<Fault> faults_ ABSL_GUARDED_BY(mu_);
  // InjectAnswer's: the fault and the body it is answered with.
  std::vector<std::pair<Fault, std::string>> answers_ ABSL_GUARDED_BY(mu_);
  absl::Duration latency_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
};

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_APISERVER_SIM_APISERVER_SIM_H_
