#include "proxy/kubelet_side/dra/slice_publisher.h"

#include <map>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "proxy/kube/json_shape.h"
#include "proxy/util/status_macros.h"

namespace dpproxy {

using Json = nlohmann::json;

namespace {

constexpr int kAttempts = 3;

std::string Collection(const std::string& version) {
  return absl::StrCat("/apis/", version, "/resourceslices");
}

}  // namespace

// The part of a slice's spec dpproxy sets: a real API server adds defaults
// to the rest, which must not read as a change.
Json SliceProjection(const Json& spec) {
  Json devices = Json::array();
  if (spec.contains("devices") && spec["devices"].is_array()) {
    for (const Json& d : spec["devices"]) {
      Json attributes = d.contains("attributes")   ? d["attributes"]
                        : d.contains("basic")      ? d["basic"].value("attributes", Json::object())
                                                   : Json::object();
      devices.push_back({{"name", d.value("name", "")}, {"attributes", attributes}});
    }
  }
  const Json pool = spec.value("pool", Json::object());
  return {{"driver", spec.value("driver", "")},
          {"nodeName", spec.value("nodeName", "")},
          {"pool", {{"name", pool.value("name", "")},
                    {"generation", pool.value("generation", int64_t{0})},
                    {"resourceSliceCount", pool.value("resourceSliceCount", int64_t{0})}}},
          {"devices", devices}};
}


absl::StatusOr<std::vector<std::string>> ServedVersions(const Json& group) {
  DPP_RETURN_IF_ERROR(CheckShape(group, "the API group resource.k8s.io",
                                 {{"versions", JsonKind::kArray},
                                  {"versions[]", JsonKind::kObject},
                                  {"versions[].version", JsonKind::kString}}));
  std::vector<std::string> served;
  if (group.contains("versions") && group["versions"].is_array()) {
    for (const Json& v : group["versions"]) served.push_back(v.value("version", ""));
  }
  return served;
}

absl::StatusOr<std::vector<Json>> SlicesOfPool(const Json& list, const std::string& node,
                                              const std::string& driver,
                                              const std::string& pool_name) {
  DPP_RETURN_IF_ERROR(CheckShape(
      list, "the ResourceSlice list",
      {{"items", JsonKind::kArray},
       {"items[]", JsonKind::kObject},
       {"items[].metadata", JsonKind::kObject},
       {"items[].metadata.name", JsonKind::kString},
       {"items[].metadata.resourceVersion", JsonKind::kString},
       {"items[].spec", JsonKind::kObject},
       {"items[].spec.nodeName", JsonKind::kString},
       {"items[].spec.driver", JsonKind::kString},
       {"items[].spec.pool", JsonKind::kObject},
       {"items[].spec.pool.name", JsonKind::kString},
       {"items[].spec.pool.generation", JsonKind::kInteger},
       {"items[].spec.pool.resourceSliceCount", JsonKind::kInteger},
       {"items[].spec.devices", JsonKind::kArray},
       {"items[].spec.devices[]", JsonKind::kObject},
       {"items[].spec.devices[].name", JsonKind::kString},
       {"items[].spec.devices[].attributes", JsonKind::kObject},
       {"items[].spec.devices[].basic", JsonKind::kObject},
       {"items[].spec.devices[].basic.attributes", JsonKind::kObject}}));
  std::vector<Json> out;
  if (!list.contains("items") || !list["items"].is_array()) return out;
  for (const Json& s : list["items"]) {
    // The server filters; checked again, as a server may ignore a selector.
    if (!s.contains("spec") || !s.contains("metadata") ||
        s["spec"].value("nodeName", "") != node || s["spec"].value("driver", "") != driver ||
        !s["spec"].contains("pool") || s["spec"]["pool"].value("name", "") != pool_name) {
      continue;
    }
    out.push_back(s);
  }
  return out;
}

SlicePublisher::SlicePublisher(KubeClient* client, std::string driver, std::string node)
    : client_(client), driver_(std::move(driver)), node_(std::move(node)) {}

std::string SlicePublisher::api_version() const {
  absl::MutexLock lock(&mu_);
  return api_version_;
}

absl::StatusOr<std::string> SlicePublisher::Version() {
  if (std::string v = api_version(); !v.empty()) return v;
  if (absl::Status s = Discover(); !s.ok()) return s;
  return api_version();
}

absl::Status SlicePublisher::Discover() {
  absl::StatusOr<Json> group = client_->Get("/apis/resource.k8s.io");
  if (!group.ok()) return group.status();
  absl::StatusOr<std::vector<std::string>> versions = ServedVersions(*group);
  if (!versions.ok()) {
    LOG(ERROR) << versions.status().message();
    return versions.status();
  }
  const std::vector<std::string>& served = *versions;
  for (const char* known : {"v1", "v1beta2", "v1beta1"}) {
    if (std::find(served.begin(), served.end(), known) != served.end()) {
      absl::MutexLock lock(&mu_);
      api_version_ = absl::StrCat("resource.k8s.io/", known);
      return absl::OkStatus();
    }
  }
  std::string list;
  for (const std::string& v : served) absl::StrAppend(&list, list.empty() ? "" : ", ", v);
  return absl::FailedPreconditionError(absl::StrCat(
      "the API server serves resource.k8s.io ", list.empty() ? "(no version)" : list,
      ", none of v1, v1beta2, v1beta1 that dpproxy writes (DRA needs Kubernetes 1.32 or later)"));
}

absl::StatusOr<std::vector<Json>> SlicePublisher::PoolSlices(const std::string& version,
                                                          const std::string& pool_name) {
  absl::StatusOr<Json> list = client_->Get(absl::StrCat(
      Collection(version), "?fieldSelector=spec.nodeName%3D", node_, "%2Cspec.driver%3D", driver_));
  if (!list.ok()) return list.status();
  absl::StatusOr<std::vector<Json>> out = SlicesOfPool(*list, node_, driver_, pool_name);
  if (!out.ok()) LOG(ERROR) << out.status().message();
  return out;
}

absl::Status SlicePublisher::Publish(const std::string& resource,
                                     const std::vector<SliceDevice>& devices) {
  absl::StatusOr<std::string> version = Version();
  if (!version.ok()) return version.status();
  absl::Status s;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    s = PublishOnce(*version, resource, devices);
    if (s.code() != absl::StatusCode::kAborted && s.code() != absl::StatusCode::kAlreadyExists) {
      return s;
    }
  }
  return s;
}

absl::Status SlicePublisher::PublishOnce(const std::string& version, const std::string& resource,
                                         const std::vector<SliceDevice>& devices) {
  PoolSpec pool{driver_, node_, resource, 0, version};
  const std::string pool_name = PoolName(pool);
  absl::StatusOr<std::vector<Json>> existing = PoolSlices(version, pool_name);
  if (!existing.ok()) return existing.status();
  std::map<std::string, Json> by_name;
  for (const Json& e : *existing) {
    pool.generation = std::max<int64_t>(pool.generation, e["spec"]["pool"].value("generation", int64_t{0}));
    by_name[e["metadata"].value("name", "")] = e;
  }
  // Unchanged if every slice there says what would be written at that
  // generation, and nothing else is there.
  absl::StatusOr<std::vector<Json>> same = BuildResourceSlices(pool, devices);
  if (!same.ok()) return same.status();
  bool changed = same->size() != by_name.size();
  for (const Json& want : *same) {
    auto it = by_name.find(want["metadata"]["name"].get<std::string>());
    if (it == by_name.end() || SliceProjection(it->second["spec"]) != SliceProjection(want["spec"])) {
      changed = true;
    }
  }
  if (!changed) return absl::OkStatus();
  ++pool.generation;
  absl::StatusOr<std::vector<Json>> slices = BuildResourceSlices(pool, devices);
  if (!slices.ok()) return slices.status();
  for (Json& want : *slices) {
    const std::string name = want["metadata"]["name"];
    auto it = by_name.find(name);
    absl::StatusOr<Json> r;
    if (it == by_name.end()) {
      r = client_->Post(Collection(version), want);
    } else {
      want["metadata"]["resourceVersion"] = it->second["metadata"].value("resourceVersion", "");
      r = client_->Put(absl::StrCat(Collection(version), "/", name), want);
      by_name.erase(it);
    }
    if (!r.ok()) return r.status();
    ++writes_;
  }
  for (const auto& [name, gone] : by_name) {
    absl::StatusOr<Json> r = client_->Delete(absl::StrCat(Collection(version), "/", name));
    if (!r.ok() && r.status().code() != absl::StatusCode::kNotFound) return r.status();
    ++writes_;
  }
  return absl::OkStatus();
}

absl::Status SlicePublisher::Unpublish(const std::string& resource) {
  absl::StatusOr<std::string> version = Version();
  if (!version.ok()) return version.status();
  absl::StatusOr<std::vector<Json>> existing =
      PoolSlices(*version, PoolName(PoolSpec{driver_, node_, resource, 0, *version}));
  if (!existing.ok()) return existing.status();
  for (const Json& e : *existing) {
    absl::StatusOr<Json> r = client_->Delete(
        absl::StrCat(Collection(*version), "/", e["metadata"].value("name", "")));
    if (!r.ok() && r.status().code() != absl::StatusCode::kNotFound) return r.status();
    ++writes_;
  }
  return absl::OkStatus();
}

}  // namespace dpproxy
