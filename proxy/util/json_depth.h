// File: json_depth.h
//
// How deeply a JSON text nests, found in one pass without recursion and
// without parsing: a text nested deeper than a reader allows is refused
// before any parser or walker sees it (a parser, a serializer or a walk
// that recurses on depth would run out of stack on a small text nested
// tens of thousands deep).
//
//   if (absl::Status s = CheckJsonDepth(body, kMaxJsonDepth); !s.ok()) ...
//   // "nested 60001 levels deep; at most 64 are accepted"
#ifndef DPPROXY_PROXY_UTIL_JSON_DEPTH_H_
#define DPPROXY_PROXY_UTIL_JSON_DEPTH_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dpproxy {

// The deepest nesting of objects and arrays dpproxy reads from others (an
// API server's answers, the kubelet's checkpoint). Kubernetes objects nest
// about a dozen levels; this leaves room and stays far from any stack's
// limit.
inline constexpr int kMaxJsonDepth = 64;

// The greatest nesting of `{`/`[` in `text`, strings (with their escapes)
// skipped. Malformed text is the parser's to refuse: this only counts.
int JsonDepth(absl::string_view text);

// kInvalidArgument saying how deep `text` nests and the limit, when it
// nests deeper than `max_depth`; the scan stops at the first level past it.
absl::Status CheckJsonDepth(absl::string_view text, int max_depth = kMaxJsonDepth);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_JSON_DEPTH_H_
