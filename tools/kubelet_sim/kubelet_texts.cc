#include "tools/kubelet_sim/kubelet_texts.h"

#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace dpproxy::sim {
namespace {

// k8s.io/apimachinery/pkg/util/validation: a qualified name's name part
// (at most 63 characters) and an RFC 1123 subdomain (at most 253).
bool IsQualifiedNamePart(const std::string& s) {
  static const std::regex kName("([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]");
  return !s.empty() && s.size() <= 63 && std::regex_match(s, kName);
}

bool IsDns1123Subdomain(const std::string& s) {
  static const std::regex kSubdomain(
      "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  return !s.empty() && s.size() <= 253 && std::regex_match(s, kSubdomain);
}

// IsQualifiedName: "name" or "prefix/name", the prefix a subdomain.
bool IsQualifiedName(absl::string_view value) {
  std::vector<std::string> parts = absl::StrSplit(value, '/');
  if (parts.size() == 1) return IsQualifiedNamePart(parts[0]);
  if (parts.size() != 2) return false;
  return IsDns1123Subdomain(parts[0]) && IsQualifiedNamePart(parts[1]);
}

// The length of the valid UTF-8 sequence at s[i] and its code point, or 0.
size_t Utf8Rune(absl::string_view s, size_t i, uint32_t* rune) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = 0;
  uint32_t r = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2, r = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3, r = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4, r = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
    r = (r << 6) | (b(i + k) & 0x3f);
  }
  const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (r < smallest[n] || r > 0x10ffff || (r >= 0xd800 && r <= 0xdfff)) return 0;
  *rune = r;
  return n;
}

}  // namespace

std::string GoQuote(absl::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      uint32_t rune = 0;
      const size_t n = Utf8Rune(s, i, &rune);
      if (n == 0) {
        absl::StrAppendFormat(&out, "\\x%02x", c);
        ++i;
      } else {
        // C1 controls are not printable to Go; the rest of what is sent
        // here (names, versions) is kept as it came.
        if (rune < 0xa0) {
          absl::StrAppendFormat(&out, "\\u%04x", rune);
        } else {
          out.append(s.data() + i, n);
        }
        i += n;
      }
      continue;
    }
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
          absl::StrAppendFormat(&out, "\\x%02x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  return out + "\"";
}

bool IsDns1123Label(absl::string_view s) {
  static const std::regex kLabel("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
  return !s.empty() && s.size() <= 63 && std::regex_match(s.begin(), s.end(), kLabel);
}

bool IsExtendedResourceName(absl::string_view name) {
  // IsNativeResource: no domain, or a kubernetes.io one.
  if (!absl::StrContains(name, "/") || absl::StrContains(name, "kubernetes.io/")) return false;
  if (absl::StartsWith(name, "requests.")) return false;
  return IsQualifiedName(absl::StrCat("requests.", name));
}

absl::Status CheckResourceName(absl::string_view name) {
  if (IsExtendedResourceName(name)) return absl::OkStatus();
  return absl::UnknownError(absl::StrCat("the ResourceName ", GoQuote(name), " is invalid"));
}

absl::Status CheckV1Beta1Version(absl::string_view version) {
  if (version == kV1Beta1Version) return absl::OkStatus();
  // api.SupportedVersions is a []string: %q prints it as ["v1beta1"].
  return absl::UnknownError(absl::StrCat("requested API version ", GoQuote(version),
                                         " is not supported by kubelet. Supported version is [",
                                         GoQuote(kV1Beta1Version), "]"));
}

absl::Status CheckV1AlphaVersion(absl::string_view version) {
  if (version == kV1AlphaVersion) return absl::OkStatus();
  return absl::UnknownError(absl::StrCat("requested API version ", GoQuote(version),
                                         " is not supported by kubelet. Supported version is ",
                                         GoQuote(kV1AlphaVersion)));
}

absl::Status CheckWatcherVersions(const std::vector<std::string>& versions) {
  for (const std::string& v : versions) {
    if (v == kV1Beta1Version) return absl::OkStatus();
  }
  // %v of a []string.
  return absl::UnknownError(absl::StrCat(
      "manager version, v1beta1, is not among plugin supported versions [",
      absl::StrJoin(versions, " "), "]"));
}

}  // namespace dpproxy::sim
