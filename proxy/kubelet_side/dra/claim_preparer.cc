#include "proxy/kubelet_side/dra/claim_preparer.h"

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
#include "absl/synchronization/notification.h"
#include "proxy/kubelet_side/dra/cdi_spec.h"
#include "proxy/kubelet_side/dra/device_names.h"
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
  if (claim.contains("metadata")) {
    out.uid = claim["metadata"].value("uid", "");
    const Json annotations = claim["metadata"].value("annotations", Json::object());
    out.extended_resource =
        annotations.is_object() &&
        annotations.value("resource.kubernetes.io/extended-resource-claim", Json()) == "true";
  }
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
    if (!Complete(allocations)) {
      // Stopped mid-prepare: the kubelet was never answered, and prepares
      // it again.
      LOG(INFO) << "claim " << uid << ": its prepare never finished; released";
      DPP_RETURN_IF_ERROR(ReleaseClaim(uid));
      continue;
    }
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

absl::StatusOr<std::vector<PreparedClaimDevice>> ClaimPreparer::Prepare(
    const ClaimRef& claim, const grpc::ServerContextBase* caller) {
  if (absl::Status s = ValidateClaimRef(claim); !s.ok()) return s;
  ClaimTurn turn(this, claim.uid);
  if (options_.journal != nullptr) {
    const std::vector<state::Allocation> held = options_.journal->ClaimAllocations(claim.uid);
    if (!held.empty() && Complete(held)) return Remembered(claim, held);
    // Reserved and never answered: a dpproxy stopped mid-prepare. The
    // kubelet was told nothing; this prepare starts over.
    if (!held.empty()) DPP_RETURN_IF_ERROR(ReleaseClaim(claim.uid));
  }
  absl::StatusOr<std::vector<PreparedClaimDevice>> out = PrepareNew(claim, caller);
  if (out.ok()) Held(claim.uid, true);
  return out;
}

bool ClaimPreparer::Complete(const std::vector<state::Allocation>& allocations) {
  for (const state::Allocation& a : allocations) {
    if (a.stage() == state::Allocation::RESERVED) return false;
  }
  return true;
}

absl::Status ClaimPreparer::ReleaseClaim(const std::string& uid) {
  std::vector<uint64_t> ids;
  for (const state::Allocation& a : options_.journal->ClaimAllocations(uid)) ids.push_back(a.id());
  return options_.journal->Release(ids);
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

absl::StatusOr<ClaimFromApi> ClaimPreparer::ReadClaim(const ClaimRef& c) {
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
  return parsed;
}

absl::StatusOr<std::vector<ClaimPreparer::PoolPart>> ClaimPreparer::PlanParts(
    const ClaimRef& c, const ClaimFromApi& claim) {
  // Ours, grouped by pool (resource), then by request (container).
  std::map<std::string, std::vector<const ClaimFromApi::Result*>> by_pool;
  for (const ClaimFromApi::Result& r : claim.results) {
    if (r.driver == options_.driver) by_pool[r.pool].push_back(&r);
  }
  std::vector<PoolPart> parts;
  for (const auto& [pool, results] : by_pool) {
    std::optional<BridgedResource> res = resources_(pool);
    if (!res.has_value()) {
      return ClaimError(c, absl::StrCat("pool ", pool, " is not one dpproxy publishes on ",
                                        options_.node));
    }
    // No plugin yet (a start, a takeover, a plugin restart): the
    // allocator waits for one, as for a device-plugin Allocate.
    if (res->allocator == nullptr) {
      return ClaimError(c, absl::StrCat("no device plugin is connected for ", res->resource,
                                        " (the kubelet retries)"));
    }
    absl::StatusOr<DraDeviceNames> names = DraDeviceNames::For(res->device_ids);
    if (!names.ok()) return ClaimError(c, std::string(names.status().message()));
    PoolPart part;
    part.pool = pool;
    part.res = *std::move(res);
    std::map<std::string, size_t> index;  // request -> its container request
    for (const ClaimFromApi::Result* r : results) {
      const std::string id = names->IdOf(r->device);
      if (id.empty()) {
        return ClaimError(c, absl::StrCat("device ", r->device, " of pool ", pool,
                                          " is not among the plugin's devices now"));
      }
      auto [it, fresh] = index.try_emplace(r->request, part.claims.size());
      if (fresh) {
        part.request.add_container_requests();
        state::DraClaim dc;
        dc.set_uid(c.uid);
        dc.set_namespace_(c.namespace_);
        dc.set_name(c.name);
        dc.set_request(r->request);
        dc.set_pool(pool);
        dc.set_extended_resource(claim.extended_resource);
        part.claims.push_back(std::move(dc));
      }
      part.request.mutable_container_requests(static_cast<int>(it->second))->add_devices_ids(id);
      part.claims[it->second].add_devices(r->device);
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

absl::Status ClaimPreparer::AllocatePart(PoolPart* part,
                                         const grpc::ServerContextBase* caller) {
  Allocator::Call call;
  call.request = part->request;
  call.timeout = absl::Nanoseconds(backend_timeout_ns_.load());
  call.caller = caller;
  call.kubelet_api = "dra";
  call.pre_start = true;  // DRA has no per-container start
  call.claims = part->claims;
  call.defer_commit = true;  // the CDI names come once every pool answered
  absl::Notification done;
  absl::Status status;
  part->res.allocator->Allocate(std::move(call), [&](absl::StatusOr<Allocator::Allocated> r) {
    if (r.ok()) {
      part->allocated = *std::move(r);
    } else {
      status = r.status();
    }
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

absl::Status ClaimPreparer::CommitParts(std::vector<PoolPart>* parts) {
  absl::Status failed;
  for (PoolPart& part : *parts) {
    if (!failed.ok()) {
      part.res.allocator->Withdraw(part.allocated.reservation);
      continue;
    }
    absl::Notification done;
    part.res.allocator->Commit(part.allocated.reservation, part.allocated.response, &part.claims,
                               [&](absl::Status s) {
                                 failed = std::move(s);
                                 done.Notify();
                               });
    done.WaitForNotification();
    if (!failed.ok()) part.res.allocator->Withdraw(part.allocated.reservation);
  }
  return failed;
}

absl::StatusOr<std::vector<PreparedClaimDevice>> ClaimPreparer::PrepareNew(
    const ClaimRef& c, const grpc::ServerContextBase* caller) {
  absl::StatusOr<ClaimFromApi> claim = ReadClaim(c);
  if (!claim.ok()) return claim.status();
  absl::StatusOr<std::vector<PoolPart>> parts = PlanParts(c, *claim);
  if (!parts.ok()) return parts.status();
  // Each pool's resource allocates through its allocator (allocator.h),
  // held in the journal from the reservation on; none is answered there
  // until every pool has its devices.
  for (size_t i = 0; i < parts->size(); ++i) {
    if (absl::Status s = AllocatePart(&(*parts)[i], caller); !s.ok()) {
      for (size_t j = 0; j < i; ++j) {
        (*parts)[j].res.allocator->Withdraw((*parts)[j].allocated.reservation);
      }
      return ClaimError(c, std::string(s.message()));
    }
  }
  absl::StatusOr<std::string> spec = NameCdiDevices(c, &*parts);
  if (!spec.ok()) {
    for (PoolPart& part : *parts) part.res.allocator->Withdraw(part.allocated.reservation);
    return spec.status();
  }
  // Journaled before the answer: a repeated prepare answers the same.
  if (absl::Status s = CommitParts(&*parts); !s.ok()) {
    if (options_.journal != nullptr) (void)ReleaseClaim(c.uid);
    return ClaimError(c, absl::StrCat("cannot journal it: ", s.message()));
  }
  if (absl::Status s = WriteClaimCdiSpec(options_.cdi_dir, options_.driver, c.uid, *spec);
      !s.ok()) {
    return ClaimError(c, absl::StrCat("cannot write its CDI spec: ", s.message()));
  }
  std::vector<PreparedClaimDevice> out;
  for (const PoolPart& part : *parts) {
    for (const state::DraClaim& dc : part.claims) AppendAnswer(dc, &out);
  }
  TellLosses(*parts);
  return out;
}

absl::StatusOr<std::string> ClaimPreparer::NameCdiDevices(const ClaimRef& c,
                                                          std::vector<PoolPart>* parts) {
  // One CDI device per pool and request: the request ('/' of a subrequest
  // as '-'), made unique if the request took devices of two pools.
  std::vector<PreparedDevice> spec_devices;
  std::set<std::string> spec_names;
  for (const PoolPart& part : *parts) {
    for (size_t i = 0; i < part.claims.size(); ++i) {
      std::string name = absl::StrReplaceAll(part.claims[i].request(), {{"/", "-"}});
      if (!spec_names.insert(name).second) {
        name = absl::StrCat(name, "-", spec_devices.size());
        spec_names.insert(name);
      }
      spec_devices.push_back(
          {name, part.allocated.response.container_responses(static_cast<int>(i))});
    }
  }
  absl::StatusOr<ClaimCdiSpec> spec = BuildClaimCdiSpec(options_.driver, c.uid, spec_devices);
  if (!spec.ok()) return ClaimError(c, std::string(spec.status().message()));
  // Each request gets its CDI names; the first record keeps the spec.
  size_t next = 0;
  for (PoolPart& part : *parts) {
    for (state::DraClaim& dc : part.claims) {
      for (const std::string& id : spec->cdi_device_ids[next]) dc.add_cdi_ids(id);
      if (next == 0) dc.set_cdi_spec(spec->json);
      ++next;
    }
  }
  return spec->json;
}

void ClaimPreparer::TellLosses(const std::vector<PoolPart>& parts) {
  if (!options_.on_loss) return;
  for (const PoolPart& part : parts) {
    const v1beta1::DevicePluginOptions opts = part.allocated.backend->options();
    Loss loss;
    for (const auto& r : part.allocated.response.container_responses()) {
      loss.annotations += r.annotations_size();
    }
    if (opts.pre_start_required()) loss.prestart_timing += static_cast<int>(part.claims.size());
    if (opts.get_preferred_allocation_available()) ++loss.preferred_allocation;
    if (loss.any()) options_.on_loss(part.res.resource, loss);
  }
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
