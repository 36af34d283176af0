#include "tools/apiserver_sim/apiserver_sim.h"

#include <httplib.h>

#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tools/apiserver_sim/apiserver_sim_reply.h"
#include "tools/apiserver_sim/k8s_protobuf.h"
#include "tools/kubelet_sim/kubelet_texts.h"

namespace dpproxy::sim {

void Reply(httplib::Response& res, int code, const nlohmann::json& body) {
  res.status = code;
  res.set_content(body.dump(), "application/json");
}

// A Kubernetes Status object, as the API server answers errors.
void Fail(httplib::Response& res, int code, const std::string& reason,
          const std::string& message) {
  Reply(res, code,
        {{"kind", "Status"},
         {"apiVersion", "v1"},
         {"metadata", nlohmann::json::object()},
         {"status", "Failure"},
         {"reason", reason},
         {"message", message},
         {"code", code}});
}

namespace {

using Json = nlohmann::json;
constexpr char kGroup[] = "resource.k8s.io";

// The claim `ns/name` of `claims`, or a 404 answered.
template <typename Map>
typename Map::iterator FindClaim(Map& claims, const httplib::Request& req,
                                 httplib::Response& res) {
  auto it = claims.find(absl::StrCat(req.matches[1].str(), "/", req.matches[2].str()));
  if (it == claims.end()) {
    Fail(res, 404, "NotFound",
         absl::StrCat("resourceclaims.resource.k8s.io \"", req.matches[2].str(),
                      "\" not found"));
  }
  return it;
}

// The slice named by the path's first group, or a 404 answered.
template <typename Map>
typename Map::iterator FindSlice(Map& slices, const httplib::Request& req,
                                 httplib::Response& res) {
  auto it = slices.find(req.matches[1].str());
  if (it == slices.end()) {
    Fail(res, 404, "NotFound",
         absl::StrCat("resourceslices.resource.k8s.io \"", req.matches[1].str(),
                      "\" not found"));
  }
  return it;
}

// A list, as the API server answers one: kind, apiVersion, the
// resourceVersion it was read at, the items.
void ReplyList(httplib::Response& res, const std::string& kind, const std::string& api_version,
               int64_t resource_version, Json items) {
  Reply(res, 200,
        {{"kind", kind},
         {"apiVersion", api_version},
         {"metadata", {{"resourceVersion", absl::StrCat(resource_version)}}},
         {"items", std::move(items)}});
}

// What the real API server refuses in a ResourceSlice; "" if nothing.
std::string InvalidSlice(const Json& s, const std::string& version) {
  if (!s.is_object() || !s.contains("spec") || !s["spec"].is_object()) return "spec: Required value";
  const Json& spec = s["spec"];
  if (!spec.contains("driver") || !spec["driver"].is_string() || spec["driver"] == "") {
    return "spec.driver: Required value";
  }
  if (!spec.contains("nodeName") || !spec["nodeName"].is_string()) {
    return "spec.nodeName: Required value (dpproxy publishes node-local devices)";
  }
  if (!spec.contains("pool") || !spec["pool"].is_object() || !spec["pool"].contains("name") ||
      !spec["pool"].contains("generation") || !spec["pool"].contains("resourceSliceCount")) {
    return "spec.pool: name, generation and resourceSliceCount are required";
  }
  if (!spec["pool"]["resourceSliceCount"].is_number_integer() ||
      spec["pool"]["resourceSliceCount"].get<int64_t>() < 1) {
    return "spec.pool.resourceSliceCount: must be greater than or equal to 1";
  }
  if (!spec.contains("devices")) return "";
  if (!spec["devices"].is_array()) return "spec.devices: must be a list";
  if (spec["devices"].size() > 128) {
    return absl::StrCat("spec.devices: Too many: ", spec["devices"].size(),
                        ": must have at most 128 items");
  }
  for (size_t i = 0; i < spec["devices"].size(); ++i) {
    const Json& d = spec["devices"][i];
    const std::string name = d.value("name", "");
    if (!IsDns1123Label(name)) {
      return absl::StrCat("spec.devices[", i, "].name: Invalid value: \"", name,
                          "\": a lowercase RFC 1123 label must consist of lower case "
                          "alphanumeric characters or '-'");
    }
    // v1beta1 keeps attributes under "basic"; v1 and v1beta2 on the device.
    const bool basic = version == "v1beta1";
    if (basic ? d.contains("attributes") : d.contains("basic")) {
      return absl::StrCat("spec.devices[", i, "]: unknown field \"",
                          basic ? "attributes" : "basic", "\" in ", kGroup, "/", version);
    }
  }
  return "";
}

// The request's object, in JSON or in Kubernetes protobuf (client-go's
// generated clientset sends built-in types so); nullopt with the error
// answered: 400 for a body that is neither, 415 for protobuf the simulator
// does not read whole.
std::optional<Json> ReadBody(const httplib::Request& req, httplib::Response& res) {
  if (absl::StartsWith(req.get_header_value("Content-Type"), kKubernetesProtobuf)) {
    absl::StatusOr<Json> j = KubernetesProtobufToJson(req.body);
    if (!j.ok()) {
      Fail(res, 415, "UnsupportedMediaType", std::string(j.status().message()));
      return std::nullopt;
    }
    return *std::move(j);
  }
  Json j = Json::parse(req.body, nullptr, false);
  if (j.is_discarded()) {
    Fail(res, 400, "BadRequest", "the body is not JSON");
    return std::nullopt;
  }
  return j;
}

}  // namespace

std::map<std::string, std::string> ApiServerSim::ParseFieldSelector(const std::string& s) {
  std::map<std::string, std::string> out;
  for (absl::string_view term : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(term, absl::MaxSplits('=', 1));
    out[kv.first] = kv.second;
  }
  return out;
}

bool ApiServerSim::SliceMatches(const Json& slice,
                                const std::map<std::string, std::string>& selector) {
  for (const auto& [field, value] : selector) {
    const std::string key = field.substr(field.find('.') + 1);
    if (slice["spec"].value(key, "") != value) return false;
  }
  return true;
}

ApiServerSim::ApiServerSim(Options options) : options_(std::move(options)) {}

ApiServerSim::~ApiServerSim() { Stop(); }

std::string ApiServerSim::url() const {
  return absl::StrCat(options_.cert_file.empty() ? "http" : "https", "://", options_.host, ":",
                      port_);
}

absl::Status ApiServerSim::Start() {
  if (options_.cert_file.empty() != options_.key_file.empty()) {
    return absl::InvalidArgumentError("a certificate needs its key and the other way round");
  }
  if (options_.cert_file.empty()) {
    server_ = std::make_unique<httplib::Server>();
  } else {
    auto tls = std::make_unique<httplib::SSLServer>(options_.cert_file.c_str(),
                                                    options_.key_file.c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot use the certificate ",
                                                     options_.cert_file, " and key ",
                                                     options_.key_file));
    }
    server_ = std::move(tls);
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = false;
  }
  Routes();
  // Started before: the same port, so that clients find it again.
  const int want = port_ > 0 ? port_ : options_.port;
  const int got = want == 0 ? server_->bind_to_any_port(options_.host)
                            : (server_->bind_to_port(options_.host, want) ? want : -1);
  if (got <= 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.host, ":", want));
  }
  port_ = got;
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // httplib's stop() does nothing until the accept loop runs: a Stop()
  // right after Start() would otherwise leave the thread accepting forever.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!server_->is_running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  events_.Emit("apiserver_started", {{"url", url()}, {"versions", options_.versions}});
  return absl::OkStatus();
}

void ApiServerSim::Stop() {
  if (server_ == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // watch streams end; their threads are joined below
  }
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
  events_.Emit("apiserver_stopped", {{"url", url()}});
}

void ApiServerSim::InjectAnswer(const std::string& method, const std::string& path_prefix,
                                int code, std::string body) {
  absl::MutexLock lock(&mu_);
  answers_.push_back({Fault{method, path_prefix, code, 1}, std::move(body)});
}

void ApiServerSim::InjectFault(Fault fault) {
  absl::MutexLock lock(&mu_);
  faults_.push_back(std::move(fault));
}

void ApiServerSim::SetLatency(absl::Duration latency) {
  absl::MutexLock lock(&mu_);
  latency_ = latency;
}

std::string ApiServerSim::GeneratedSuffix() {
  static constexpr char kAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
  absl::MutexLock lock(&mu_);
  uint64_t n = static_cast<uint64_t>(++resource_version_) * 2654435761u;
  std::string out;
  for (int i = 0; i < 5; ++i, n /= 27) out.push_back(kAlphabet[n % 27]);
  return out;
}

ApiServerSim::Json ApiServerSim::PutClaim(Json claim) {
  absl::MutexLock lock(&mu_);
  Json& m = claim["metadata"];
  // As a real API server makes them: RFC 4122 UUIDs.
  if (!m.contains("uid")) {
    m["uid"] = absl::StrFormat("00000000-0000-4000-8000-%012d", ++resource_version_);
  }
  m["resourceVersion"] = absl::StrCat(++resource_version_);
  claims_[absl::StrCat(m.value("namespace", "default"), "/", m.value("name", ""))] = claim;
  return claim;
}

std::map<std::string, ApiServerSim::Json> ApiServerSim::Slices() {
  absl::MutexLock lock(&mu_);
  return slices_;
}

int ApiServerSim::DeleteSlicesOfNode(const std::string& node) {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (auto it = slices_.begin(); it != slices_.end();) {
    if (it->second["spec"].value("nodeName", "") == node) {
      NoteSlice("DELETED", it->second);
      it = slices_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

void ApiServerSim::PutNode(const std::string& name, const std::string& kubelet_version) {
  absl::MutexLock lock(&mu_);
  const std::string uid = absl::StrFormat("00000000-0000-4000-b000-%012d", ++resource_version_);
  nodes_[name] = {{"kind", "Node"},
                  {"apiVersion", "v1"},
                  {"metadata",
                   {{"name", name},
                    {"uid", uid},
                    {"resourceVersion", std::to_string(++resource_version_)}}},
                  {"status", {{"nodeInfo", {{"kubeletVersion", kubelet_version}}}}}};
}

void ApiServerSim::SetNodeAllocatable(const std::string& name,
                                      const std::map<std::string, int64_t>& allocatable) {
  absl::MutexLock lock(&mu_);
  Json& n = nodes_[name];
  if (n.is_null()) {
    n = {{"kind", "Node"},
         {"apiVersion", "v1"},
         {"metadata",
          {{"name", name},
           {"uid", absl::StrFormat("00000000-0000-4000-b000-%012d", ++resource_version_)}}},
         {"status", Json::object()}};
  }
  Json a = Json::object();
  for (const auto& [resource, count] : allocatable) a[resource] = std::to_string(count);
  if (n["status"].value("allocatable", Json::object()) == a) return;
  n["status"]["allocatable"] = a;  // (capacity also counts Unhealthy devices: not played)
  n["metadata"]["resourceVersion"] = std::to_string(++resource_version_);
}

ApiServerSim::Json ApiServerSim::Node(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(name);
  return it == nodes_.end() ? Json() : it->second;
}

// Every request first: the bearer token, then an injected fault or answer,
// then the latency set. Whether it answered; if not, the route does.
bool ApiServerSim::PreRoute(const httplib::Request& req, httplib::Response& res) {
  if (!options_.token.empty() &&
      req.get_header_value("Authorization") != absl::StrCat("Bearer ", options_.token)) {
    Fail(res, 401, "Unauthorized", "Unauthorized");
    return true;
  }
  absl::Duration latency;
  std::optional<int> fault;
  std::optional<std::string> body;
  {
    absl::MutexLock lock(&mu_);
    latency = latency_;
    for (auto it = answers_.begin(); it != answers_.end() && !fault.has_value(); ++it) {
      if ((it->first.method.empty() || it->first.method == req.method) &&
          absl::StartsWith(req.path, it->first.path_prefix)) {
        fault = it->first.code;
        body = std::move(it->second);
        answers_.erase(it);
        break;
      }
    }
    for (auto it = faults_.begin(); it != faults_.end() && !fault.has_value(); ++it) {
      if ((it->method.empty() || it->method == req.method) &&
          absl::StartsWith(req.path, it->path_prefix)) {
        fault = it->code;
        if (--it->times <= 0) faults_.erase(it);
        break;
      }
    }
  }
  // The server's own slowness, as a real overloaded one answers late.
  if (latency > absl::ZeroDuration()) {
    events_.Emit("request_delayed", {{"method", req.method},
                                     {"path", req.path},
                                     {"latency_ms", absl::ToInt64Milliseconds(latency)}});
    absl::SleepFor(latency);
  }
  if (!fault.has_value()) return false;
  if (body.has_value()) {
    res.status = *fault;
    res.set_content(*body, "application/json");
    return true;
  }
  switch (*fault) {
    case 409:
      Fail(res, 409, "Conflict",
           "Operation cannot be fulfilled: the object has been modified; please apply your "
           "changes to the latest version and try again");
      break;
    case 403:
      Fail(res, 403, "Forbidden",
           absl::StrCat("the caller cannot ", req.method, " ", req.path,
                        " (a role without that verb)"));
      break;
    case 429:
      Fail(res, 429, "TooManyRequests", "the server has received too many requests");
      break;
    case 503:
      Fail(res, 503, "ServiceUnavailable", "the server is currently unable to handle the request");
      break;
    default:
      Fail(res, *fault, "InternalError", "an error on the server has prevented the request");
  }
  return true;
}

void ApiServerSim::Routes() {
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return PreRoute(req, res) ? httplib::Server::HandlerResponse::Handled
                              : httplib::Server::HandlerResponse::Unhandled;
  });
  server_->set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    events_.Emit("request", {{"method", req.method}, {"path", req.path}, {"code", res.status}});
  });
  NodeRoutes();
  server_->Get("/apis/resource.k8s.io", [this](const httplib::Request&, httplib::Response& res) {
    Json versions = Json::array();
    for (const std::string& v : options_.versions) {
      versions.push_back({{"groupVersion", absl::StrCat(kGroup, "/", v)}, {"version", v}});
    }
    Reply(res, 200,
          {{"kind", "APIGroup"},
           {"apiVersion", "v1"},
           {"name", kGroup},
           {"versions", versions},
           {"preferredVersion", versions.empty() ? Json::object() : versions[0]}});
  });
  for (const std::string& v : options_.versions) {
    SliceRoutes(v);
    ClaimRoutes(v);
    DeviceClassRoutes(v);
  }
}

void ApiServerSim::NodeRoutes() {
  server_->Get(R"(/api/v1/nodes/([^/]+))", [this](const httplib::Request& req,
                                                   httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    auto it = nodes_.find(req.matches[1].str());
    if (it == nodes_.end()) {
      return Fail(res, 404, "NotFound",
                  absl::StrCat("nodes \"", req.matches[1].str(), "\" not found"));
    }
    Reply(res, 200, it->second);
  });
  // An update of the node's metadata and spec (taints, say), refused on a
  // stale resourceVersion; the status stays as the kubelet wrote it (the
  // API server takes status only through /status).
  server_->Put(R"(/api/v1/nodes/([^/]+))", [this](const httplib::Request& req,
                                                   httplib::Response& res) {
    const std::string name = req.matches[1].str();
    Json n = Json::parse(req.body, nullptr, false);
    if (n.is_discarded() || !n.is_object() || !n.contains("metadata") ||
        !n["metadata"].is_object()) {
      return Fail(res, 400, "BadRequest", "the body is not a Node");
    }
    if (n["metadata"].value("name", "") != name) {
      return Fail(res, 400, "BadRequest",
                  "the name of the object does not match the name on the URL");
    }
    absl::MutexLock lock(&mu_);
    auto it = nodes_.find(name);
    if (it == nodes_.end()) {
      return Fail(res, 404, "NotFound", absl::StrCat("nodes \"", name, "\" not found"));
    }
    if (n["metadata"].value("resourceVersion", "") !=
        it->second["metadata"].value("resourceVersion", "")) {
      return Fail(res, 409, "Conflict",
                  absl::StrCat("Operation cannot be fulfilled on nodes \"", name,
                               "\": the object has been modified; please apply your changes "
                               "to the latest version and try again"));
    }
    n["status"] = it->second.value("status", Json::object());
    n["metadata"]["resourceVersion"] = std::to_string(++resource_version_);
    it->second = n;
    Reply(res, 200, n);
  });
}

void ApiServerSim::ClaimRoutes(const std::string& version) {
  const std::string base = absl::StrCat("/apis/", kGroup, "/", version);
  const std::string api_version = absl::StrCat(kGroup, "/", version);
  // Claims: created as the API does (a uid and resourceVersion given);
  // the scheduler's allocation written to status with PUT .../status.
  server_->Post(base + R"(/namespaces/([^/]+)/resourceclaims)",
                [this, api_version](const httplib::Request& req, httplib::Response& res) {
                  Json c = Json::parse(req.body, nullptr, false);
                  if (c.is_discarded() || !c.is_object() || !c.contains("metadata") ||
                      !c["metadata"].is_object()) {
                    return Fail(res, 422, "Invalid", "metadata.name: Required value");
                  }
                  if (c["metadata"].value("name", "").empty()) {
                    // generateName: the prefix and five random characters,
                    // from the API server's alphabet (no vowels).
                    const std::string prefix = c["metadata"].value("generateName", "");
                    if (prefix.empty()) {
                      return Fail(res, 422, "Invalid",
                                  "metadata.name: Required value: name or generateName is "
                                  "required");
                    }
                    c["metadata"]["name"] = absl::StrCat(prefix, GeneratedSuffix());
                  }
                  const std::string ns = req.matches[1];
                  const std::string key = absl::StrCat(ns, "/", c["metadata"]["name"].get<std::string>());
                  {
                    absl::MutexLock lock(&mu_);
                    if (claims_.count(key) > 0) {
                      return Fail(res, 409, "AlreadyExists",
                                  absl::StrCat("resourceclaims.resource.k8s.io \"",
                                               c["metadata"]["name"].get<std::string>(),
                                               "\" already exists"));
                    }
                  }
                  c["apiVersion"] = api_version;
                  c["kind"] = "ResourceClaim";
                  c["metadata"]["namespace"] = ns;
                  c["metadata"].erase("uid");
                  Reply(res, 201, PutClaim(c));
                });
  server_->Put(base + R"(/namespaces/([^/]+)/resourceclaims/([^/]+)/status)",
               [this](const httplib::Request& req, httplib::Response& res) {
                 Json c = Json::parse(req.body, nullptr, false);
                 absl::MutexLock lock(&mu_);
                 auto it = FindClaim(claims_, req, res);
                 if (it == claims_.end()) return;
                 if (c.is_discarded() || !c.contains("status")) {
                   return Fail(res, 422, "Invalid", "status: Required value");
                 }
                 if (c["metadata"].value("resourceVersion", "") !=
                     it->second["metadata"].value("resourceVersion", "")) {
                   return Fail(res, 409, "Conflict",
                               "the object has been modified; please apply your changes to "
                               "the latest version and try again");
                 }
                 it->second["status"] = c["status"];
                 it->second["metadata"]["resourceVersion"] = absl::StrCat(++resource_version_);
                 Reply(res, 200, it->second);
               });
  // Every claim of every namespace (the scheduler's view).
  server_->Get(base + "/resourceclaims",
               [this, api_version](const httplib::Request&, httplib::Response& res) {
                 Json items = Json::array();
                 absl::MutexLock lock(&mu_);
                 for (const auto& [key, c] : claims_) items.push_back(c);
                 ReplyList(res, "ResourceClaimList", api_version, resource_version_, std::move(items));
               });
  server_->Get(base + R"(/namespaces/([^/]+)/resourceclaims/([^/]+))",
               [this](const httplib::Request& req, httplib::Response& res) {
                 absl::MutexLock lock(&mu_);
                 auto it = FindClaim(claims_, req, res);
                 if (it != claims_.end()) Reply(res, 200, it->second);
               });
  // As the claim controller deletes a pod's generated claim when the pod
  // is gone: its devices are free for the scheduler again.
  server_->Delete(base + R"(/namespaces/([^/]+)/resourceclaims/([^/]+))",
                  [this](const httplib::Request& req, httplib::Response& res) {
                    absl::MutexLock lock(&mu_);
                    auto it = FindClaim(claims_, req, res);
                    if (it == claims_.end()) return;
                    Json gone = it->second;
                    claims_.erase(it);
                    Reply(res, 200, gone);
                  });
}

void ApiServerSim::DeviceClassRoutes(const std::string& version) {
  const std::string base = absl::StrCat("/apis/", kGroup, "/", version);
  const std::string api_version = absl::StrCat(kGroup, "/", version);
  // DeviceClasses (cluster-scoped): created, listed, read.
  server_->Post(base + "/deviceclasses",
                [this, api_version](const httplib::Request& req, httplib::Response& res) {
                  Json c = Json::parse(req.body, nullptr, false);
                  if (c.is_discarded() || !c.is_object() || !c.contains("metadata") ||
                      !c["metadata"].is_object() ||
                      c["metadata"].value("name", "").empty()) {
                    return Fail(res, 422, "Invalid", "metadata.name: Required value");
                  }
                  const std::string name = c["metadata"]["name"];
                  if (c.contains("spec") && c["spec"].is_object() &&
                      c["spec"].contains("extendedResourceName")) {
                    const Json& e = c["spec"]["extendedResourceName"];
                    if (!e.is_string() || !IsExtendedResourceName(e.get<std::string>())) {
                      return Fail(res, 422, "Invalid",
                                  absl::StrCat("spec.extendedResourceName: Invalid value: ",
                                               e.dump(), ": must be an extended resource name"));
                    }
                  }
                  absl::MutexLock lock(&mu_);
                  if (device_classes_.count(name) > 0) {
                    return Fail(res, 409, "AlreadyExists",
                                absl::StrCat("deviceclasses.resource.k8s.io \"", name,
                                             "\" already exists"));
                  }
                  c["apiVersion"] = api_version;
                  c["kind"] = "DeviceClass";
                  c["metadata"]["uid"] =
                      absl::StrFormat("00000000-0000-4000-a000-%012d", ++resource_version_);
                  c["metadata"]["resourceVersion"] = absl::StrCat(resource_version_);
                  device_classes_[name] = c;
                  Reply(res, 201, c);
                });
  server_->Get(base + "/deviceclasses",
               [this, api_version](const httplib::Request&, httplib::Response& res) {
                 Json items = Json::array();
                 absl::MutexLock lock(&mu_);
                 for (const auto& [name, c] : device_classes_) items.push_back(c);
                 ReplyList(res, "DeviceClassList", api_version, resource_version_, std::move(items));
               });
  server_->Get(base + R"(/deviceclasses/([^/]+))",
               [this](const httplib::Request& req, httplib::Response& res) {
                 absl::MutexLock lock(&mu_);
                 auto it = device_classes_.find(req.matches[1].str());
                 if (it == device_classes_.end()) {
                   return Fail(res, 404, "NotFound",
                               absl::StrCat("deviceclasses.resource.k8s.io \"",
                                            req.matches[1].str(), "\" not found"));
                 }
                 Reply(res, 200, it->second);
               });
}

void ApiServerSim::SliceRoutes(const std::string& version) {
  const std::string base = absl::StrCat("/apis/", kGroup, "/", version);
  const std::string api_version = absl::StrCat(kGroup, "/", version);
  server_->Get(base + "/resourceslices",
               [this, api_version](const httplib::Request& req, httplib::Response& res) {
                 const std::string watch = req.get_param_value("watch");
                 if (watch == "true" || watch == "1") {
                   return ServeSliceWatch(req, res, api_version);
                 }
                 const auto selector = ParseFieldSelector(req.get_param_value("fieldSelector"));
                 Json items = Json::array();
                 absl::MutexLock lock(&mu_);
                 for (const auto& [name, s] : slices_) {
                   if (SliceMatches(s, selector)) items.push_back(s);
                 }
                 ReplyList(res, "ResourceSliceList", api_version, resource_version_,
                           std::move(items));
               });
  server_->Post(base + "/resourceslices", [this, version, api_version](
                                              const httplib::Request& req,
                                              httplib::Response& res) {
    std::optional<Json> s = ReadBody(req, res);
    if (!s.has_value()) return;
    if (const std::string bad = InvalidSlice(*s, version); !bad.empty()) {
      return Fail(res, 422, "Invalid", bad);
    }
    Json& meta = (*s)["metadata"];
    if (!meta.is_object()) meta = Json::object();
    if (meta.value("name", "").empty()) {
      // generateName, as the resourceslice controller names its slices.
      const std::string prefix = meta.value("generateName", "");
      if (prefix.empty()) {
        return Fail(res, 422, "Invalid",
                    "metadata.name: Required value: name or generateName is required");
      }
      meta["name"] = absl::StrCat(prefix, GeneratedSuffix());
    }
    const std::string name = meta["name"];
    absl::MutexLock lock(&mu_);
    if (slices_.count(name) > 0) {
      return Fail(res, 409, "AlreadyExists",
                  absl::StrCat("resourceslices.resource.k8s.io \"", name, "\" already exists"));
    }
    (*s)["apiVersion"] = api_version;
    (*s)["kind"] = "ResourceSlice";
    meta["uid"] = absl::StrFormat("00000000-0000-4000-9000-%012d", ++resource_version_);
    meta["resourceVersion"] = absl::StrCat(resource_version_);
    slices_[name] = *s;
    NoteSlice("ADDED", *s);
    Reply(res, 201, *s);
  });
  const std::string one = base + R"(/resourceslices/([^/]+))";
  server_->Get(one, [this](const httplib::Request& req, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    auto it = FindSlice(slices_, req, res);
    if (it != slices_.end()) Reply(res, 200, it->second);
  });
  server_->Put(one, [this, version, api_version](const httplib::Request& req,
                                                 httplib::Response& res) {
    const std::string name = req.matches[1];
    std::optional<Json> s = ReadBody(req, res);
    if (!s.has_value()) return;
    if (const std::string bad = InvalidSlice(*s, version); !bad.empty()) {
      return Fail(res, 422, "Invalid", bad);
    }
    absl::MutexLock lock(&mu_);
    auto it = FindSlice(slices_, req, res);
    if (it == slices_.end()) return;
    if ((*s)["metadata"].value("resourceVersion", "") !=
        it->second["metadata"].value("resourceVersion", "")) {
      return Fail(res, 409, "Conflict",
                  absl::StrCat("Operation cannot be fulfilled on resourceslices.resource.k8s.io "
                               "\"", name, "\": the object has been modified; please apply "
                               "your changes to the latest version and try again"));
    }
    (*s)["apiVersion"] = api_version;
    (*s)["kind"] = "ResourceSlice";
    (*s)["metadata"]["uid"] = it->second["metadata"]["uid"];
    (*s)["metadata"]["resourceVersion"] = absl::StrCat(++resource_version_);
    it->second = *s;
    NoteSlice("MODIFIED", *s);
    Reply(res, 200, *s);
  });
  server_->Delete(one, [this](const httplib::Request& req, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    auto it = FindSlice(slices_, req, res);
    if (it == slices_.end()) return;
    Json gone = it->second;
    slices_.erase(it);
    NoteSlice("DELETED", gone);
    Reply(res, 200, gone);
  });
}

}  // namespace dpproxy::sim
