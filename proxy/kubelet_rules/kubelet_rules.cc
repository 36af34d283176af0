#include "proxy/kubelet_rules/kubelet_rules.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace dpproxy {
namespace {

bool IsAlnum(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)); }

// Kubernetes' qualified-name part: [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?,
// at most 63 characters.
bool IsQualifiedNamePart(absl::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  if (!IsAlnum(s.front()) || !IsAlnum(s.back())) return false;
  for (char c : s) {
    if (!IsAlnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return true;
}

bool IsQualifiedName(absl::string_view s) {
  std::vector<absl::string_view> parts = absl::StrSplit(s, '/');
  if (parts.size() == 1) return IsQualifiedNamePart(parts[0]);
  if (parts.size() != 2) return false;
  return IsDnsSubdomain(parts[0]) && IsQualifiedNamePart(parts[1]);
}

}  // namespace

// RFC 1123 DNS subdomain: lower-case labels [a-z0-9]([-a-z0-9]*[a-z0-9])?
// separated by dots, at most 253 characters.
bool IsDnsSubdomain(absl::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (absl::string_view label : absl::StrSplit(s, '.')) {
    if (label.empty()) return false;
    auto ok_end = [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    };
    if (!ok_end(label.front()) || !ok_end(label.back())) return false;
    for (char c : label) {
      if (!ok_end(c) && c != '-') return false;
    }
  }
  return true;
}

bool IsDnsLabel(absl::string_view s) {
  return s.size() <= 63 && s.find('.') == absl::string_view::npos && IsDnsSubdomain(s);
}


std::string GoQuote(absl::string_view s) {
  // Untrusted input is echoed only up to a bound: a 100 KB version string
  // must not come back whole in errors, logs and events.
  const absl::string_view shown = s.substr(0, kMaxEchoBytes);
  std::string out = "\"";
  for (unsigned char c : shown) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\a': out += "\\a"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\v': out += "\\v"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\x%02x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += "\"";
  if (shown.size() < s.size()) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

std::string EchoField(absl::string_view s) {
  std::string out(s.substr(0, kMaxEchoBytes));
  if (out.size() < s.size()) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

std::string GoStringSlice(const std::vector<std::string>& v) {
  // Go's %v, bounded like GoQuote: untrusted lists are echoed in part.
  constexpr size_t kMaxItems = 16;
  std::vector<std::string> shown;
  for (size_t i = 0; i < v.size() && i < kMaxItems; ++i) {
    shown.push_back(v[i].size() <= kMaxEchoBytes
                        ? v[i]
                        : absl::StrCat(v[i].substr(0, kMaxEchoBytes), "... (", v[i].size(),
                                       " bytes)"));
  }
  if (v.size() > kMaxItems) shown.push_back(absl::StrCat("... (", v.size() - kMaxItems, " more)"));
  return absl::StrCat("[", absl::StrJoin(shown, " "), "]");
}

bool IsExtendedResourceName(absl::string_view name) {
  // Native resources live in the default namespace (no '/') or in
  // kubernetes.io; neither may be served by a device plugin.
  if (!absl::StrContains(name, "/")) return false;
  if (absl::StrContains(name, "kubernetes.io/")) return false;
  if (absl::StartsWith(name, "requests.")) return false;
  return IsQualifiedName(absl::StrCat("requests.", name));
}

absl::Status ValidateResourceName(absl::string_view name) {
  if (IsExtendedResourceName(name)) return absl::OkStatus();
  return absl::UnknownError(
      absl::StrCat("the ResourceName ", GoQuote(name), " is invalid"));
}

absl::Status ValidateV1Beta1Version(absl::string_view version) {
  if (version == kV1Beta1Version) return absl::OkStatus();
  return absl::UnknownError(absl::StrCat(
      "requested API version ", GoQuote(version),
      " is not supported by kubelet. Supported version is [",
      GoQuote(kV1Beta1Version), "]"));
}

absl::Status ValidateV1AlphaVersion(absl::string_view version) {
  if (version == kV1AlphaVersion) return absl::OkStatus();
  return absl::UnknownError(absl::StrCat(
      "requested API version ", GoQuote(version),
      " is not supported by kubelet. Supported version is ",
      GoQuote(kV1AlphaVersion)));
}

absl::Status ValidateWatcherVersions(const std::vector<std::string>& versions) {
  for (const std::string& v : versions) {
    if (v == kV1Beta1Version) return absl::OkStatus();
  }
  return absl::UnknownError(absl::StrCat(
      "manager version, v1beta1, is not among plugin supported versions ",
      GoStringSlice(versions)));
}

absl::Status ValidateEndpointName(absl::string_view endpoint) {
  if (endpoint.empty()) {
    return absl::InvalidArgumentError("endpoint is empty");
  }
  if (endpoint.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "endpoint ", GoQuote(endpoint),
        " is absolute; it must be a socket name relative to the plugin "
        "directory"));
  }
  for (unsigned char c : endpoint) {
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "endpoint ", GoQuote(endpoint), " contains a control character (NUL, newline, ...)"));
    }
  }
  if (endpoint == kKubeletSocketName) {
    return absl::InvalidArgumentError(absl::StrCat(
        "endpoint ", GoQuote(endpoint),
        " is the registration socket itself, not a device plugin's socket"));
  }
  for (absl::string_view part : absl::StrSplit(endpoint, '/')) {
    if (part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          "endpoint ", GoQuote(endpoint), " escapes the plugin directory"));
    }
  }
  return absl::OkStatus();
}

std::string PrintableId(absl::string_view id) {
  for (unsigned char c : id) {
    if (c < 0x20 || c == 0x7f) return GoQuote(id);
  }
  return std::string(id);
}

absl::Status ValidateDeviceId(absl::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError("a device ID is empty");
  for (unsigned char c : id) {
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device ID ", GoQuote(id), " contains a control character (NUL, newline, ...)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace dpproxy
