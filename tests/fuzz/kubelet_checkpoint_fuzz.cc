// The kubelet checkpoint reader: any text parses or gives kDataLoss.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "proxy/kubelet/kubelet_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dpproxy::KubeletCheckpoint> k = dpproxy::ParseKubeletCheckpoint(text);
  if (!k.ok() && k.status().code() != absl::StatusCode::kDataLoss) std::abort();
  return 0;
}
