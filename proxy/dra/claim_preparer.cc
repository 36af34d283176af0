#include "proxy/dra/claim_preparer.h"

#include <errno.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "proxy/dra/cdi_spec.h"
#include "proxy/dra/device_names.h"
#include "proxy/kube/json_shape.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/util/files.h"
#include "proxy/util/status_macros.h"

namespace dpproxy {
namespace {

using Json = nlohmann::json;

absl::Status ClaimError(const ClaimRef& c, const std::string& what) {
  return absl::FailedPreconditionError(
      absl::StrCat("claim ", c.namespace_, "/", c.name, ": ", what));
}

Json ToJson(const std::vector<PreparedClaimDevice>& devices) {
  Json out = Json::array();
  for (const PreparedClaimDevice& d : devices) {
    out.push_back({{"requests", d.requests},
                   {"pool", d.pool},
                   {"device", d.device},
                   {"cdi_ids", d.cdi_ids}});
  }
  return out;
}

std::vector<PreparedClaimDevice> FromJson(const Json& j) {
  std::vector<PreparedClaimDevice> out;
  for (const Json& d : j) {
    // Shape-checked by the caller; absent fields are empty.
    out.push_back({d.value("requests", std::vector<std::string>{}), d.value("pool", ""),
                   d.value("device", ""), d.value("cdi_ids", std::vector<std::string>{})});
  }
  return out;
}

}  // namespace

std::string DraLossReason(const std::string& kind) {
  if (kind == "annotations") {
    return "the plugin's container annotations are dropped: CDI has no container annotations";
  }
  if (kind == "prestart_timing") {
    return "PreStartContainer runs during prepare, before the container is created: DRA has "
           "no per-container start";
  }
  if (kind == "preferred_allocation") {
    return "the plugin's GetPreferredAllocation is not asked: the scheduler chose the devices";
  }
  return absl::StrCat(kind, " is lost");
}

ClaimPreparer::ClaimPreparer(Options options, KubeClient* client, ResourceByPool resources)
    : options_(std::move(options)),
      backend_timeout_ns_(absl::ToInt64Nanoseconds(options_.backend_timeout)),
      client_(client),
      resources_(std::move(resources)) {}

namespace {

bool IsUid(absl::string_view uid) {
  if (uid.size() != 36) return false;
  for (size_t i = 0; i < uid.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? uid[i] != '-' : !absl::ascii_isxdigit(static_cast<unsigned char>(uid[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status ValidateClaimRef(const ClaimRef& c) {
  if (!IsUid(c.uid)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "claim UID ", GoQuote(c.uid), " is not a Kubernetes UID (8-4-4-4-12 hexadecimal digits)"));
  }
  if (!IsDnsLabel(c.namespace_)) {
    return absl::InvalidArgumentError(absl::StrCat("claim namespace ", GoQuote(c.namespace_),
                                                   " is not a DNS label"));
  }
  if (!IsDnsSubdomain(c.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("claim name ", GoQuote(c.name), " is not a DNS subdomain"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ClaimFromApi> ParseClaim(const Json& claim) {
  DPP_RETURN_IF_ERROR(CheckShape(
      claim, "the ResourceClaim",
      {{"metadata", JsonKind::kObject},
       {"metadata.uid", JsonKind::kString},
       {"status", JsonKind::kObject},
       {"status.allocation", JsonKind::kObject},
       {"status.allocation.devices", JsonKind::kObject},
       {"status.allocation.devices.results", JsonKind::kArray},
       {"status.allocation.devices.results[]", JsonKind::kObject},
       {"status.allocation.devices.results[].driver", JsonKind::kString},
       {"status.allocation.devices.results[].pool", JsonKind::kString},
       {"status.allocation.devices.results[].device", JsonKind::kString},
       {"status.allocation.devices.results[].request", JsonKind::kString}}));
  ClaimFromApi out;
  if (claim.contains("metadata")) out.uid = claim["metadata"].value("uid", "");
  const Json results = claim.value("/status/allocation/devices/results"_json_pointer, Json());
  out.allocated = results.is_array();
  if (!out.allocated) return out;
  for (const Json& r : results) {
    out.results.push_back({r.value("request", ""), r.value("driver", ""), r.value("pool", ""),
                           r.value("device", "")});
  }
  return out;
}

std::string ClaimPreparer::RecordPath(const std::string& uid) const {
  return JoinPath(options_.state_dir, absl::StrCat(uid, ".json"));
}

ClaimPreparer::ClaimTurn::ClaimTurn(ClaimPreparer* p, const std::string& uid) : p_(p), uid_(uid) {
  absl::MutexLock lock(&p_->mu_);
  struct Free {
    ClaimPreparer* p;
    const std::string* uid;
  } free{p_, &uid_};
  p_->mu_.Await(absl::Condition(
      +[](Free* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f->p->mu_) {
        return f->p->busy_.count(*f->uid) == 0;
      },
      &free));
  p_->busy_.insert(uid_);
}

ClaimPreparer::ClaimTurn::~ClaimTurn() {
  absl::MutexLock lock(&p_->mu_);
  p_->busy_.erase(uid_);
}

absl::StatusOr<int> ClaimPreparer::RestoreSpecs() {
  if (options_.state_dir.empty() || !PathExists(options_.state_dir)) return 0;
  int written = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(options_.state_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!absl::EndsWith(name, ".json")) continue;
    const std::string uid = name.substr(0, name.size() - 5);
    if (!IsUid(uid)) continue;  // not a record of ours
    ClaimTurn turn(this, uid);
    absl::StatusOr<std::string> text = ReadFile(e.path().string());
    Json record = text.ok() ? Json::parse(*text, nullptr, false) : Json();
    if (!record.is_object() || !record.contains("spec") || !record["spec"].is_string()) {
      LOG(WARNING) << "unreadable prepared-claim record " << e.path().string() << "; skipped";
      continue;
    }
    Held(uid, true);
    if (PathExists(ClaimCdiSpecPath(options_.cdi_dir, options_.driver, uid))) continue;
    if (absl::Status s = WriteClaimCdiSpec(options_.cdi_dir, options_.driver, uid,
                                           record["spec"].get<std::string>());
        !s.ok()) {
      return s;
    }
    ++written;
  }
  if (ec) {
    return absl::InternalError(absl::StrCat("list ", options_.state_dir, ": ", ec.message()));
  }
  return written;
}

absl::StatusOr<std::vector<PreparedClaimDevice>> ClaimPreparer::Prepare(const ClaimRef& claim) {
  if (absl::Status s = ValidateClaimRef(claim); !s.ok()) return s;
  ClaimTurn turn(this, claim.uid);
  if (!options_.state_dir.empty()) {
    if (absl::StatusOr<std::string> text = ReadFile(RecordPath(claim.uid)); text.ok()) {
      Json record = Json::parse(*text, nullptr, false);
      const bool usable =
          !record.is_discarded() && record.contains("devices") && record.contains("spec") &&
          CheckShape(record, "record", {{"spec", JsonKind::kString},
                                        {"devices", JsonKind::kArray},
                                        {"devices[]", JsonKind::kObject},
                                        {"devices[].requests", JsonKind::kArray},
                                        {"devices[].requests[]", JsonKind::kString},
                                        {"devices[].pool", JsonKind::kString},
                                        {"devices[].device", JsonKind::kString},
                                        {"devices[].cdi_ids", JsonKind::kArray},
                                        {"devices[].cdi_ids[]", JsonKind::kString}})
              .ok();
      if (usable) {
        // Prepared before: the same answer. The spec again if a reboot
        // emptied the CDI directory.
        const std::string spec_path =
            ClaimCdiSpecPath(options_.cdi_dir, options_.driver, claim.uid);
        if (!PathExists(spec_path)) {
          if (absl::Status s = WriteClaimCdiSpec(options_.cdi_dir, options_.driver, claim.uid,
                                                 record["spec"].get<std::string>());
              !s.ok()) {
            return s;
          }
          LOG(INFO) << "claim " << claim.namespace_ << "/" << claim.name
                    << ": CDI spec written again (it was gone)";
        }
        Held(claim.uid, true);
        return FromJson(record["devices"]);
      }
      LOG(WARNING) << "claim " << claim.uid << ": unreadable record " << RecordPath(claim.uid)
                   << "; preparing it again";
    }
  }
  absl::StatusOr<std::vector<PreparedClaimDevice>> out = PrepareNew(claim);
  if (out.ok()) Held(claim.uid, true);
  return out;
}

void ClaimPreparer::Held(const std::string& uid, bool held) {
  absl::MutexLock lock(&mu_);
  if (held) {
    prepared_.insert(uid);
  } else {
    prepared_.erase(uid);
  }
}

int ClaimPreparer::prepared_claims() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(prepared_.size());
}

absl::StatusOr<std::vector<PreparedClaimDevice>> ClaimPreparer::PrepareNew(const ClaimRef& c) {
  absl::StatusOr<std::string> version = options_.api_version();
  if (!version.ok()) {
    return ClaimError(c, absl::StrCat("cannot read the claim: ", version.status().message()));
  }
  absl::StatusOr<Json> claim = client_->Get(absl::StrCat(
      "/apis/", *version, "/namespaces/", c.namespace_, "/resourceclaims/", c.name));
  if (!claim.ok()) return ClaimError(c, std::string(claim.status().message()));
  absl::StatusOr<ClaimFromApi> parsed = ParseClaim(*claim);
  if (!parsed.ok()) {
    LOG(ERROR) << parsed.status().message();
    return ClaimError(c, std::string(parsed.status().message()));
  }
  if (parsed->uid != c.uid) {
    return ClaimError(c, absl::StrCat("the API server has UID ", parsed->uid,
                                      ", the kubelet asked for ", c.uid,
                                      " (deleted and created again?)"));
  }
  if (!parsed->allocated) return ClaimError(c, "not allocated (no status.allocation)");
  // Ours, grouped by pool (resource), then by request (container).
  struct Wanted {
    std::string request, pool, device, id;
  };
  std::map<std::string, std::vector<Wanted>> by_pool;
  for (const ClaimFromApi::Result& r : parsed->results) {
    if (r.driver != options_.driver) continue;
    by_pool[r.pool].push_back({r.request, r.pool, r.device, ""});
  }
  std::vector<PreparedDevice> spec_devices;  // one per pool and request
  std::vector<std::string> spec_key;         // "pool\nrequest" of each
  std::set<std::string> spec_names;
  std::vector<std::pair<std::string, Loss>> lost;  // told once the claim is prepared
  std::vector<PreparedClaimDevice> out;
  for (auto& [pool, wanted] : by_pool) {
    std::optional<BridgedResource> res = resources_(pool);
    if (!res.has_value()) {
      return ClaimError(c, absl::StrCat("pool ", pool, " is not one dpproxy publishes on ",
                                        options_.node));
    }
    if (res->backend == nullptr) {
      return ClaimError(c, absl::StrCat("no device plugin is connected for ", res->resource,
                                        " (the kubelet retries)"));
    }
    absl::StatusOr<DraDeviceNames> names = DraDeviceNames::For(res->device_ids);
    if (!names.ok()) return ClaimError(c, std::string(names.status().message()));
    std::vector<std::string> requests;  // in first-seen order
    std::map<std::string, std::vector<std::string>> ids_of;
    for (Wanted& w : wanted) {
      w.id = names->IdOf(w.device);
      if (w.id.empty()) {
        return ClaimError(c, absl::StrCat("device ", w.device, " of pool ", pool,
                                          " is not among the plugin's devices now"));
      }
      if (ids_of.count(w.request) == 0) requests.push_back(w.request);
      ids_of[w.request].push_back(w.id);
    }
    v1beta1::AllocateRequest req;
    for (const std::string& r : requests) {
      auto* cr = req.add_container_requests();
      for (const std::string& id : ids_of[r]) cr->add_devices_ids(id);
    }
    absl::StatusOr<v1beta1::AllocateResponse> resp =
        res->backend->Allocate(req, absl::Nanoseconds(backend_timeout_ns_.load()));
    if (!resp.ok()) return ClaimError(c, std::string(resp.status().message()));
    if (res->backend->options().pre_start_required()) {
      for (const std::string& r : requests) {
        v1beta1::PreStartContainerRequest pre;
        for (const std::string& id : ids_of[r]) pre.add_devices_ids(id);
        if (absl::Status s = res->backend->PreStartContainer(pre, absl::Nanoseconds(backend_timeout_ns_.load()));
            !s.ok()) {
          return ClaimError(c, std::string(s.message()));
        }
      }
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      // A CDI device name: the request ('/' of a subrequest as '-'), made
      // unique if the request took devices of two pools.
      std::string name = absl::StrReplaceAll(requests[i], {{"/", "-"}});
      if (!spec_names.insert(name).second) {
        name = absl::StrCat(name, "-", spec_devices.size());
        spec_names.insert(name);
      }
      spec_key.push_back(absl::StrCat(pool, "\n", requests[i]));
      spec_devices.push_back({name, resp->container_responses(static_cast<int>(i))});
    }
    for (const Wanted& w : wanted) out.push_back({{w.request}, w.pool, w.device, {}});
    Loss resource_loss;
    for (const auto& r : resp->container_responses()) {
      resource_loss.annotations += r.annotations_size();
    }
    if (res->backend->options().pre_start_required()) {
      resource_loss.prestart_timing += static_cast<int>(requests.size());
    }
    if (res->backend->options().get_preferred_allocation_available()) {
      ++resource_loss.preferred_allocation;
    }
    if (resource_loss.any()) lost.emplace_back(res->resource, resource_loss);
  }
  absl::StatusOr<ClaimCdiSpec> spec = BuildClaimCdiSpec(options_.driver, c.uid, spec_devices);
  if (!spec.ok()) return ClaimError(c, std::string(spec.status().message()));
  // Each device gets the CDI names of its request.
  std::map<std::string, std::vector<std::string>> cdi_of;
  for (size_t i = 0; i < spec_devices.size(); ++i) cdi_of[spec_key[i]] = spec->cdi_device_ids[i];
  for (PreparedClaimDevice& d : out) d.cdi_ids = cdi_of[absl::StrCat(d.pool, "\n", d.requests[0])];
  if (absl::Status s = WriteClaimCdiSpec(options_.cdi_dir, options_.driver, c.uid, spec->json);
      !s.ok()) {
    return ClaimError(c, absl::StrCat("cannot write its CDI spec: ", s.message()));
  }
  if (!options_.state_dir.empty()) {
    if (absl::Status s = MakeDirs(options_.state_dir); !s.ok()) return s;
    const Json record = {{"claim", {{"namespace", c.namespace_}, {"name", c.name}, {"uid", c.uid}}},
                         {"devices", ToJson(out)},
                         {"spec", spec->json}};
    if (absl::Status s = WriteFileAtomic(RecordPath(c.uid), record.dump()); !s.ok()) {
      return ClaimError(c, absl::StrCat("cannot remember it: ", s.message()));
    }
  }
  if (options_.on_loss) {
    for (const auto& [resource, l] : lost) options_.on_loss(resource, l);
  }
  return out;
}

absl::Status ClaimPreparer::Unprepare(const ClaimRef& c) {
  // Before any path is made of it: nothing outside dpproxy's directories
  // is ever touched, whatever the caller names.
  if (absl::Status s = ValidateClaimRef(c); !s.ok()) return s;
  ClaimTurn turn(this, c.uid);
  if (absl::Status s = RemoveClaimCdiSpec(options_.cdi_dir, options_.driver, c.uid); !s.ok()) {
    return s;
  }
  Held(c.uid, false);
  if (options_.state_dir.empty()) return absl::OkStatus();
  const std::string path = RecordPath(c.uid);
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("remove ", path, ": ", ErrnoText(errno)));
  }
  return SyncDir(options_.state_dir);
}

}  // namespace dpproxy
