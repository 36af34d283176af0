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

// The answer for one journaled allocation of a claim: each device with
// its request's CDI names.
void AppendAnswer(const state::DraClaim& c, std::vector<PreparedClaimDevice>* out) {
  for (const std::string& device : c.devices()) {
    out->push_back({{c.request()},
                    c.pool(),
                    device,
                    std::vector<std::string>(c.cdi_ids().begin(), c.cdi_ids().end())});
  }
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

absl::StatusOr<int> ClaimPreparer::MigrateClaimFiles() {
  if (options_.journal == nullptr || options_.claim_files_dir.empty() ||
      !PathExists(options_.claim_files_dir)) {
    return 0;
  }
  int moved = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(options_.claim_files_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!absl::EndsWith(name, ".json")) continue;
    const std::string uid = name.substr(0, name.size() - 5);
    if (!IsUid(uid)) continue;  // not a record of ours
    absl::StatusOr<std::string> text = ReadFile(e.path().string());
    Json record = text.ok() ? Json::parse(*text, nullptr, false) : Json();
    absl::Status shape =
        record.is_discarded() || !record.is_object()
            ? absl::InvalidArgumentError("not a JSON object")
            : CheckShape(record, "the claim file", {{"spec", JsonKind::kString},
                                                    {"claim", JsonKind::kObject},
                                                    {"claim.namespace", JsonKind::kString},
                                                    {"claim.name", JsonKind::kString},
                                                    {"devices", JsonKind::kArray},
                                                    {"devices[]", JsonKind::kObject},
                                                    {"devices[].requests", JsonKind::kArray},
                                                    {"devices[].requests[]", JsonKind::kString},
                                                    {"devices[].pool", JsonKind::kString},
                                                    {"devices[].device", JsonKind::kString},
                                                    {"devices[].cdi_ids", JsonKind::kArray},
                                                    {"devices[].cdi_ids[]", JsonKind::kString}});
    if (!shape.ok() || !record.contains("devices") || !record.contains("spec")) {
      LOG(WARNING) << "prepared-claim file " << e.path().string() << " is unreadable ("
                   << (shape.ok() ? std::string("no devices or spec") : std::string(shape.message()))
                   << "); left in place";
      continue;
    }
    ClaimTurn turn(this, uid);
    if (options_.journal->ClaimAllocations(uid).empty()) {
      if (absl::Status s = MigrateClaimFile(uid, record); !s.ok()) return s;
    }
    if (::unlink(e.path().c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(absl::StrCat("remove ", e.path().string(), ": ", ErrnoText(errno)));
    }
    ++moved;
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("list ", options_.claim_files_dir, ": ", ec.message()));
  }
  if (moved > 0) {
    DPP_RETURN_IF_ERROR(SyncDir(options_.claim_files_dir));
    // The directory goes once it is empty.
    (void)::rmdir(options_.claim_files_dir.c_str());
  }
  return moved;
}

absl::Status ClaimPreparer::MigrateClaimFile(const std::string& uid, const Json& record) {
  // One allocation per pool and request, as a prepare journals them.
  std::map<std::pair<std::string, std::string>, state::DraClaim> by_key;
  std::vector<std::pair<std::string, std::string>> order;
  for (const PreparedClaimDevice& d : FromJson(record["devices"])) {
    const std::pair<std::string, std::string> key(
        d.pool, d.requests.empty() ? std::string() : d.requests[0]);
    auto [it, fresh] = by_key.try_emplace(key);
    if (fresh) {
      order.push_back(key);
      state::DraClaim& c = it->second;
      c.set_uid(uid);
      c.set_namespace_(record["claim"].value("namespace", ""));
      c.set_name(record["claim"].value("name", ""));
      c.set_request(key.second);
      c.set_pool(d.pool);
      for (const std::string& id : d.cdi_ids) c.add_cdi_ids(id);
    }
    it->second.add_devices(d.device);
  }
  bool spec_kept = false;
  for (const auto& key : order) {
    state::DraClaim& c = by_key[key];
    if (!spec_kept) c.set_cdi_spec(record["spec"].get<std::string>());
    spec_kept = true;
    // The plugin's IDs of the devices, where the resource is known now.
    std::optional<BridgedResource> res = resources_(c.pool());
    v1beta1::AllocateRequest req;
    auto* cr = req.add_container_requests();
    if (res.has_value()) {
      absl::StatusOr<DraDeviceNames> names = DraDeviceNames::For(res->device_ids);
      for (const std::string& device : c.devices()) {
        const std::string id = names.ok() ? names->IdOf(device) : std::string();
        if (!id.empty()) cr->add_devices_ids(id);
      }
    }
    const std::vector<state::DraClaim> claims = {c};
    BackendSide backend;
    backend.claims = &claims;
    DPP_RETURN_IF_ERROR(options_.journal->Record(res.has_value() ? res->resource : c.pool(), req,
                                                 v1beta1::AllocateResponse(), backend));
  }
  LOG(INFO) << "claim " << uid << ": moved from its file into the journal";
  return absl::OkStatus();
}

absl::StatusOr<int> ClaimPreparer::RestoreSpecs() {
  if (options_.journal == nullptr) return 0;
  int written = 0;
  for (const auto& [uid, allocations] : options_.journal->Claims()) {
    ClaimTurn turn(this, uid);
    Held(uid, true);
    if (PathExists(ClaimCdiSpecPath(options_.cdi_dir, options_.driver, uid))) continue;
    for (const state::Allocation& a : allocations) {
      if (a.claim().cdi_spec().empty()) continue;
      DPP_RETURN_IF_ERROR(
          WriteClaimCdiSpec(options_.cdi_dir, options_.driver, uid, a.claim().cdi_spec()));
      ++written;
      break;
    }
  }
  return written;
}

absl::StatusOr<std::vector<PreparedClaimDevice>> ClaimPreparer::Remembered(
    const ClaimRef& claim, const std::vector<state::Allocation>& allocations) {
  std::vector<PreparedClaimDevice> out;
  std::string spec;
  for (const state::Allocation& a : allocations) {
    AppendAnswer(a.claim(), &out);
    if (spec.empty()) spec = a.claim().cdi_spec();
  }
  // Prepared before: the same answer. The spec again if a reboot emptied
  // the CDI directory.
  if (!spec.empty() &&
      !PathExists(ClaimCdiSpecPath(options_.cdi_dir, options_.driver, claim.uid))) {
    DPP_RETURN_IF_ERROR(WriteClaimCdiSpec(options_.cdi_dir, options_.driver, claim.uid, spec));
    LOG(INFO) << "claim " << claim.namespace_ << "/" << claim.name
              << ": CDI spec written again (it was gone)";
  }
  Held(claim.uid, true);
  return out;
}

absl::StatusOr<std::vector<PreparedClaimDevice>> ClaimPreparer::Prepare(const ClaimRef& claim) {
  if (absl::Status s = ValidateClaimRef(claim); !s.ok()) return s;
  ClaimTurn turn(this, claim.uid);
  if (options_.journal != nullptr) {
    const std::vector<state::Allocation> held = options_.journal->ClaimAllocations(claim.uid);
    if (!held.empty()) return Remembered(claim, held);
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
  // Per resource: what the journal keeps of its Allocate.
  struct Journaled {
    std::string resource;
    BackendSide backend;
    v1beta1::AllocateRequest req;
    v1beta1::AllocateResponse resp;
    std::vector<state::DraClaim> claims;  // one per container request
  };
  std::vector<Journaled> journaled;
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
    Journaled j;
    j.resource = res->resource;
    j.backend.api = std::string(ApiWireVersion(res->backend->api()));
    j.backend.endpoint = res->backend->endpoint();
    j.backend.resource = res->backend->resource();
    j.req = req;
    j.resp = *resp;
    for (const std::string& r : requests) {
      state::DraClaim dc;
      dc.set_uid(c.uid);
      dc.set_namespace_(c.namespace_);
      dc.set_name(c.name);
      dc.set_request(r);
      dc.set_pool(pool);
      for (const Wanted& w : wanted) {
        if (w.request == r) dc.add_devices(w.device);
      }
      j.claims.push_back(std::move(dc));
    }
    journaled.push_back(std::move(j));
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
  // Each request gets its CDI names; the first record keeps the spec.
  std::map<std::string, std::vector<std::string>> cdi_of;
  for (size_t i = 0; i < spec_devices.size(); ++i) cdi_of[spec_key[i]] = spec->cdi_device_ids[i];
  std::vector<PreparedClaimDevice> out;
  for (Journaled& j : journaled) {
    for (state::DraClaim& dc : j.claims) {
      for (const std::string& id : cdi_of[absl::StrCat(dc.pool(), "\n", dc.request())]) {
        dc.add_cdi_ids(id);
      }
      if (out.empty()) dc.set_cdi_spec(spec->json);
      AppendAnswer(dc, &out);
    }
  }
  // Journaled before the answer: a repeated prepare answers the same.
  if (options_.journal != nullptr) {
    for (Journaled& j : journaled) {
      j.backend.claims = &j.claims;
      if (absl::Status s = options_.journal->Record(j.resource, j.req, j.resp, j.backend);
          !s.ok()) {
        std::vector<uint64_t> ids;
        for (const state::Allocation& a : options_.journal->ClaimAllocations(c.uid)) {
          ids.push_back(a.id());
        }
        (void)options_.journal->Release(ids);
        return ClaimError(c, absl::StrCat("cannot journal it: ", s.message()));
      }
    }
  }
  if (absl::Status s = WriteClaimCdiSpec(options_.cdi_dir, options_.driver, c.uid, spec->json);
      !s.ok()) {
    return ClaimError(c, absl::StrCat("cannot write its CDI spec: ", s.message()));
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
  if (options_.journal == nullptr) return absl::OkStatus();
  std::vector<uint64_t> ids;
  for (const state::Allocation& a : options_.journal->ClaimAllocations(c.uid)) ids.push_back(a.id());
  return options_.journal->Release(ids);
}

}  // namespace dpproxy
