#include "proxy/kubelet_side/dra/cdi_spec.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

using Json = nlohmann::json;

absl::Status Bad(const std::string& device, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("device ", device, ": ", what, "; no CDI spec written"));
}

}  // namespace

std::string CdiKind(const std::string& driver) { return absl::StrCat(driver, "/claim"); }

absl::StatusOr<ClaimCdiSpec> BuildClaimCdiSpec(const std::string& driver,
                                               const std::string& claim_uid,
                                               const std::vector<PreparedDevice>& devices) {
  ClaimCdiSpec out;
  const std::string kind = CdiKind(driver);
  Json spec_devices = Json::array();
  for (const PreparedDevice& d : devices) {
    const v1beta1::ContainerAllocateResponse& r = d.response;
    const std::string name = absl::StrCat(claim_uid, "-", d.device_name);
    Json edits = Json::object();
    // Sorted: the same answer always gives the same file.
    std::map<std::string, std::string> envs(r.envs().begin(), r.envs().end());
    for (const auto& [k, v] : envs) {
      if (k.empty() || absl::StrContains(k, '=')) {
        return Bad(d.device_name, absl::StrCat("env name \"", k, "\" is empty or has '='"));
      }
      edits["env"].push_back(absl::StrCat(k, "=", v));
    }
    for (const v1beta1::DeviceSpec& n : r.devices()) {
      if (!absl::StartsWith(n.container_path(), "/") || !absl::StartsWith(n.host_path(), "/")) {
        return Bad(d.device_name, absl::StrCat("device node \"", n.host_path(), "\" -> \"",
                                               n.container_path(), "\" is not absolute"));
      }
      Json node = {{"path", n.container_path()}, {"hostPath", n.host_path()}};
      // The plugin API's "rwm" is cgroup access, CDI's too; empty: the
      // runtime's default.
      if (!n.permissions().empty()) node["permissions"] = n.permissions();
      edits["deviceNodes"].push_back(std::move(node));
    }
    for (const v1beta1::Mount& m : r.mounts()) {
      if (!absl::StartsWith(m.container_path(), "/") || !absl::StartsWith(m.host_path(), "/")) {
        return Bad(d.device_name, absl::StrCat("mount \"", m.host_path(), "\" -> \"",
                                               m.container_path(), "\" is not absolute"));
      }
      edits["mounts"].push_back({{"hostPath", m.host_path()},
                                 {"containerPath", m.container_path()},
                                 {"options", m.read_only() ? Json({"bind", "ro"})
                                                           : Json({"bind", "rw"})}});
    }
    out.loss.annotations += r.annotations_size();
    std::vector<std::string> ids;
    // A device with no edits of its own (only the plugin's CDI names) needs
    // no entry in this spec.
    if (!edits.empty()) {
      spec_devices.push_back({{"name", name}, {"containerEdits", std::move(edits)}});
      ids.push_back(absl::StrCat(kind, "=", name));
    }
    for (const v1beta1::CDIDevice& c : r.cdi_devices()) ids.push_back(c.name());
    out.cdi_device_ids.push_back(std::move(ids));
  }
  out.json = Json({{"cdiVersion", kCdiVersion}, {"kind", kind}, {"devices", spec_devices}})
                 .dump(1);
  out.json += "\n";
  return out;
}

std::string ClaimCdiSpecPath(const std::string& cdi_dir, const std::string& driver,
                             const std::string& claim_uid) {
  return JoinPath(cdi_dir, absl::StrCat("dpproxy-", driver, "-", claim_uid, ".json"));
}

absl::Status WriteClaimCdiSpec(const std::string& cdi_dir, const std::string& driver,
                               const std::string& claim_uid, const std::string& json) {
  if (absl::Status s = MakeDirs(cdi_dir); !s.ok()) return s;
  return WriteFileAtomic(ClaimCdiSpecPath(cdi_dir, driver, claim_uid), json, 0644);
}

absl::Status RemoveClaimCdiSpec(const std::string& cdi_dir, const std::string& driver,
                                const std::string& claim_uid) {
  const std::string path = ClaimCdiSpecPath(cdi_dir, driver, claim_uid);
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("remove ", path, ": ", ErrnoText(errno)));
  }
  return SyncDir(cdi_dir);
}

}  // namespace dpproxy
