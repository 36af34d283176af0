// The state snapshot decoder: any bytes decode or give kDataLoss; what
// decodes encodes back to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "proxy/state/state_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dpproxy::state::State> s = dpproxy::DecodeStateFile(bytes);
  if (s.ok()) {
    absl::StatusOr<dpproxy::state::State> again =
        dpproxy::DecodeStateFile(dpproxy::EncodeStateFile(*s));
    if (!again.ok()) std::abort();
  } else if (s.status().code() != absl::StatusCode::kDataLoss) {
    std::abort();
  }
  return 0;
}
