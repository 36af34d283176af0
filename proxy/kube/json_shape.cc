#include "proxy/kube/json_shape.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proxy/util/json_depth.h"

namespace dpproxy {
namespace {

using Json = nlohmann::json;

const char* KindName(JsonKind k) {
  switch (k) {
    case JsonKind::kObject: return "an object";
    case JsonKind::kArray: return "an array";
    case JsonKind::kString: return "a string";
    case JsonKind::kNumber: return "a number";
    case JsonKind::kInteger: return "an integer";
    case JsonKind::kBool: return "a boolean";
  }
  return "?";
}

const char* TypeName(const Json& j) {
  if (j.is_object()) return "an object";
  if (j.is_array()) return "an array";
  if (j.is_string()) return "a string";
  if (j.is_number_integer()) return "an integer";
  if (j.is_number()) return "a number";
  if (j.is_boolean()) return "a boolean";
  return "null";
}

bool Is(const Json& j, JsonKind k) {
  switch (k) {
    case JsonKind::kObject: return j.is_object();
    case JsonKind::kArray: return j.is_array();
    case JsonKind::kString: return j.is_string();
    case JsonKind::kNumber: return j.is_number();
    case JsonKind::kInteger: return j.is_number_integer();
    case JsonKind::kBool: return j.is_boolean();
  }
  return false;
}

// Walks `parts[i..]` below `j` (reached as `at`); the first mismatch.
absl::Status Walk(const Json& j, const std::vector<std::string>& parts, size_t i,
                  const std::string& at, JsonKind kind) {
  if (j.is_null()) return absl::OkStatus();  // absent or null: the reader's default
  if (i == parts.size()) {
    if (Is(j, kind)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(at, " is ", TypeName(j), ", not ", KindName(kind)));
  }
  std::string name = parts[i];
  const bool each = name.size() > 2 && name.compare(name.size() - 2, 2, "[]") == 0;
  if (each) name.resize(name.size() - 2);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(at.empty() ? "the answer" : at, " is ", TypeName(j), ", not an object"));
  }
  auto it = j.find(name);
  if (it == j.end()) return absl::OkStatus();
  const std::string here = at.empty() ? name : absl::StrCat(at, ".", name);
  if (!each) return Walk(*it, parts, i + 1, here, kind);
  if (it->is_null()) return absl::OkStatus();
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(here, " is ", TypeName(*it), ", not an array"));
  }
  for (size_t n = 0; n < it->size(); ++n) {
    absl::Status s = Walk((*it)[n], parts, i + 1, absl::StrCat(here, "[", n, "]"), kind);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

void DropNulls(Json* root) {
  // Every container still to clean. A pointer to a kept member or element
  // stays valid: its parent is never changed again once it was cleaned.
  std::vector<Json*> todo{root};
  while (!todo.empty()) {
    Json* j = todo.back();
    todo.pop_back();
    if (j->is_object()) {
      for (auto it = j->begin(); it != j->end();) {
        if (it->is_null()) {
          it = j->erase(it);
          continue;
        }
        if (it->is_structured()) todo.push_back(&*it);
        ++it;
      }
    } else if (j->is_array()) {
      Json::array_t& a = j->get_ref<Json::array_t&>();
      a.erase(std::remove_if(a.begin(), a.end(), [](const Json& e) { return e.is_null(); }),
              a.end());
      for (Json& e : a) {
        if (e.is_structured()) todo.push_back(&e);
      }
    }
  }
}

absl::StatusOr<Json> ParseAnswer(absl::string_view body) {
  if (absl::Status s = CheckJsonDepth(body); !s.ok()) return s;
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("not JSON");
  DropNulls(&j);
  return j;
}

absl::Status CheckShape(const Json& j, const std::string& what,
                        const std::vector<JsonField>& fields) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the answer is ", TypeName(j),
                                                   ", not an object"));
  }
  for (const JsonField& f : fields) {
    std::vector<std::string> parts = absl::StrSplit(f.path, '.');
    absl::Status s = Walk(j, parts, 0, "", f.kind);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace dpproxy
