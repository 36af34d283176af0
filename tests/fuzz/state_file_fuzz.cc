// The state snapshot decoder: any bytes decode or give kDataLoss; what
// decodes encodes back to the same bytes. The input is also taken as a
// payload under a good checksum and decoded both ways, whole and with the
// allocations taken out as their bytes (as dpproxy loads it): both succeed
// or both fail, with the same allocations, in order, and the same rest.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "proxy/state/allocation_table.h"
#include "proxy/state/state_store.h"

namespace {

void CompareTheTwoDecoders(const std::string& payload) {
  const std::string file = dpproxy::EncodeStateFilePayload(payload);
  absl::StatusOr<dpproxy::state::State> whole = dpproxy::DecodeStateFile(file);
  std::vector<std::string> taken;
  dpproxy::AllocationTable table;
  absl::StatusOr<dpproxy::state::State> rest =
      dpproxy::DecodeStateFile(file, [&](absl::string_view wire) {
        taken.emplace_back(wire);
        return table.PutEncoded(wire);
      });
  if (whole.ok() != rest.ok()) std::abort();
  if (!whole.ok()) return;
  if (rest->allocations_size() != 0) std::abort();
  if (static_cast<int>(taken.size()) != whole->allocations_size()) std::abort();
  for (size_t i = 0; i < taken.size(); ++i) {
    dpproxy::state::Allocation a;
    if (!a.ParseFromString(taken[i])) std::abort();
    if (a.SerializeAsString() != whole->allocations(static_cast<int>(i)).SerializeAsString()) {
      std::abort();
    }
  }
  whole->clear_allocations();
  if (whole->SerializeAsString() != rest->SerializeAsString()) std::abort();
}

}  // namespace

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
  CompareTheTwoDecoders(bytes);
  return 0;
}
