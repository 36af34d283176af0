#include "proxy/util/json_depth.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dpproxy {
namespace {

// The greatest depth, or the first depth past `stop_above` once reached.
int Scan(absl::string_view text, int stop_above) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '{':
      case '[':
        deepest = std::max(deepest, ++depth);
        if (deepest > stop_above) return deepest;
        break;
      case '}':
      case ']':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return deepest;
}

}  // namespace

int JsonDepth(absl::string_view text) { return Scan(text, static_cast<int>(text.size()) + 1); }

absl::Status CheckJsonDepth(absl::string_view text, int max_depth) {
  if (Scan(text, max_depth) <= max_depth) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("nested more than ", max_depth,
                                                 " levels deep (", JsonDepth(text),
                                                 " here); at most ", max_depth,
                                                 " are accepted"));
}

}  // namespace dpproxy
