// File: encoding.h
//
// Checksums and fixed-width integers for dpproxy's own file formats and
// stable identifiers.
#ifndef DPPROXY_PROXY_UTIL_ENCODING_H_
#define DPPROXY_PROXY_UTIL_ENCODING_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace dpproxy {

inline constexpr uint64_t kFnv64Offset = 14695981039346656037ULL;

// FNV-1a, 64 bits; `seed` replaces the standard offset basis.
inline uint64_t Fnv64(absl::string_view data, uint64_t seed = kFnv64Offset) {
  uint64_t h = seed;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// FNV-1a, 32 bits.
inline uint32_t Fnv32a(absl::string_view data) {
  uint32_t h = 2166136261u;
  for (unsigned char c : data) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

// Appends `v` little endian.
template <typename T>
void PutLittleEndian(std::string* out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Reads a little-endian T at `pos`; the caller checks the bounds.
template <typename T>
T GetLittleEndian(absl::string_view in, size_t pos) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<T>(static_cast<unsigned char>(in[pos + i])) << (8 * i);
  }
  return v;
}

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_ENCODING_H_
