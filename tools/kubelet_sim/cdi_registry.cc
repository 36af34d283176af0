#include "tools/kubelet_sim/cdi_registry.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proxy/util/files.h"

namespace dpproxy::sim {
namespace {

using Json = nlohmann::json;

// YAML as the JSON it stands for. CDI specs hold strings, lists and maps,
// plus a few numbers and booleans (uid, gid, major); plain scalars that read
// as a number or boolean become one.
Json FromYaml(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Sequence: {
      Json out = Json::array();
      for (const YAML::Node& e : n) out.push_back(FromYaml(e));
      return out;
    }
    case YAML::NodeType::Map: {
      Json out = Json::object();
      for (const auto& kv : n) out[kv.first.as<std::string>()] = FromYaml(kv.second);
      return out;
    }
    case YAML::NodeType::Scalar: {
      if (n.Tag() == "!") return n.as<std::string>();  // quoted
      int64_t i;
      if (YAML::convert<int64_t>::decode(n, i)) return i;
      bool b;
      if (YAML::convert<bool>::decode(n, b)) return b;
      return n.as<std::string>();
    }
    default:
      return nullptr;
  }
}

struct Spec {
  std::string file;
  Json json;
};

// Every readable spec of `dirs`, by kind.
std::map<std::string, std::vector<Spec>> LoadSpecs(const std::vector<std::string>& dirs,
                                                   std::vector<std::string>* warnings) {
  std::map<std::string, std::vector<Spec>> by_kind;
  for (const std::string& dir : dirs) {
    std::error_code ec;
    std::set<std::string> files;  // sorted: the same order every time
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string p = e.path().string();
      if (absl::EndsWith(p, ".json") || absl::EndsWith(p, ".yaml")) files.insert(p);
    }
    for (const std::string& file : files) {
      absl::StatusOr<std::string> text = ReadFile(file);
      if (!text.ok()) {
        warnings->push_back(absl::StrCat(file, ": ", text.status().message()));
        continue;
      }
      Json spec;
      if (absl::EndsWith(file, ".json")) {
        spec = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
        if (spec.is_discarded()) {
          warnings->push_back(absl::StrCat(file, ": not JSON"));
          continue;
        }
      } else {
        try {
          spec = FromYaml(YAML::Load(*text));
        } catch (const YAML::Exception& e) {
          warnings->push_back(absl::StrCat(file, ": not YAML: ", e.what()));
          continue;
        }
      }
      if (!spec.is_object() || !spec.contains("kind") || !spec["kind"].is_string() ||
          !spec.contains("devices") || !spec["devices"].is_array()) {
        warnings->push_back(absl::StrCat(file, ": not a CDI spec (kind and devices required)"));
        continue;
      }
      by_kind[spec["kind"].get<std::string>()].push_back({file, std::move(spec)});
    }
  }
  return by_kind;
}

void Apply(const Json& edits, Json& out) {
  if (!edits.is_object()) return;
  for (const char* key : {"env", "deviceNodes", "mounts"}) {
    if (!edits.contains(key) || !edits[key].is_array()) continue;
    for (const Json& e : edits[key]) out[key].push_back(e);
  }
}

}  // namespace

CdiResolution ResolveCdiDevices(const std::vector<std::string>& dirs,
                                const std::vector<std::string>& names) {
  CdiResolution r;
  const std::map<std::string, std::vector<Spec>> by_kind = LoadSpecs(dirs, &r.warnings);
  std::set<std::string> specs_applied;
  for (const std::string& name : names) {
    const size_t eq = name.find('=');
    if (eq == std::string::npos || name.find('/') > eq) {
      r.errors.push_back(absl::StrCat("\"", name, "\" is not a qualified CDI device name "
                                      "(vendor.com/class=name)"));
      continue;
    }
    const std::string kind = name.substr(0, eq);
    const std::string device = name.substr(eq + 1);
    std::vector<std::pair<const Spec*, const Json*>> found;
    auto it = by_kind.find(kind);
    if (it != by_kind.end()) {
      for (const Spec& s : it->second) {
        for (const Json& d : s.json["devices"]) {
          if (d.is_object() && d.value("name", "") == device) found.push_back({&s, &d});
        }
      }
    }
    if (found.empty()) {
      r.errors.push_back(absl::StrCat("unresolvable CDI device ", name, ": no spec of kind ",
                                      kind, " in ", absl::StrJoin(dirs, ", "),
                                      " defines it"));
      continue;
    }
    if (found.size() > 1) {
      std::vector<std::string> files;
      for (const auto& [s, d] : found) files.push_back(s->file);
      r.errors.push_back(absl::StrCat("CDI device ", name, " is defined more than once: ",
                                      absl::StrJoin(files, ", ")));
      continue;
    }
    const auto [spec, dev] = found.front();
    if (specs_applied.insert(spec->file).second) {
      Apply(spec->json.value("containerEdits", Json()), r.edits);
    }
    Apply(dev->value("containerEdits", Json()), r.edits);
  }
  return r;
}

}  // namespace dpproxy::sim
