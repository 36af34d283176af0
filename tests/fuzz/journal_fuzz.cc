// The journal reader: any bytes parse (intact records, a torn tail, damage
// in the middle, zeros written ahead) or give kDataLoss; the byte counts
// always add up, what is taken for space ahead is zeros only, and the
// records merge into a state without losing any.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "proxy/state/journal_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dpproxy::JournalContents> j = dpproxy::ParseJournal(bytes);
  if (!j.ok()) {
    if (j.status().code() != absl::StatusCode::kDataLoss) std::abort();
    return 0;
  }
  if (j->valid_bytes + j->cut_bytes + j->preallocated_bytes != bytes.size()) std::abort();
  for (size_t i = bytes.size() - j->preallocated_bytes; i < bytes.size(); ++i) {
    if (bytes[i] != '\0') std::abort();
  }
  // A torn tail never ends in a zero byte (those are space ahead).
  if (j->cut_bytes > 0 && bytes[j->valid_bytes + j->cut_bytes - 1] == '\0') std::abort();
  dpproxy::state::State st;
  dpproxy::MergeJournal(j->records, &st);
  // Every record is kept (duplicates of identical records merge into one).
  if (static_cast<size_t>(st.allocations_size()) > j->records.size()) std::abort();
  return 0;
}
