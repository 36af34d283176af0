// File: json_shape.h
//
// Answers from the API server are checked by type before they are read:
// a field that is there with the wrong type fails the call with the
// field's path, instead of an exception from the JSON library (which
// would end the process, or escape a gRPC handler). Fields that are
// absent are the reader's business (it takes a default).
//
//   absl::Status s = CheckShape(answer, "ResourceSlice list",
//                               {{"items", JsonKind::kArray},
//                                {"items[].spec.pool.generation", JsonKind::kNumber}});
//   // "ResourceSlice list: items[3].spec.pool.generation is a string, not a number"
#ifndef DPPROXY_PROXY_KUBE_JSON_SHAPE_H_
#define DPPROXY_PROXY_KUBE_JSON_SHAPE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include <nlohmann/json.hpp>

namespace dpproxy {

// kInteger: a number without a fraction (counts, generations).
enum class JsonKind { kObject, kArray, kString, kNumber, kInteger, kBool };

struct JsonField {
  // Dotted path from the root; "name[]" stands for every element of the
  // array `name` ("items[].metadata.name").
  std::string path;
  JsonKind kind;
};

// Removes null members of objects and null elements of arrays, at every
// depth: a null means the field is not there (Go encodes nil maps and
// slices as null), so readers that take a default for an absent field are
// never handed a null. KubeClient does it to every answer. Iterative: its
// stack does not grow with the depth of `j`.
void DropNulls(nlohmann::json* j);

// An answer's body as KubeClient reads it: refused when nested deeper than
// kMaxJsonDepth (json_depth.h) before any parser sees it, parsed, nulls
// dropped. kInvalidArgument saying which ("nested more than 64 levels
// deep ...", "not JSON").
absl::StatusOr<nlohmann::json> ParseAnswer(absl::string_view body);

// kInvalidArgument naming `what` and the first field (with its indexes)
// whose type is wrong; also when a parent on the way is not an object or
// an array where the path needs one. OK for absent fields and null.
absl::Status CheckShape(const nlohmann::json& j, const std::string& what,
                        const std::vector<JsonField>& fields);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBE_JSON_SHAPE_H_
