// The readers of the API server's answers (DRA mode) against any bytes:
// whatever the JSON, they answer or fail with a status, and never throw
// (an exception from the JSON library would end dpproxy, or escape a gRPC
// handler), and never run out of stack on a deeply nested answer. The
// input is read as the API server's answer, as KubeClient hands it over
// (depth checked, nulls dropped), to each reader; and, as text, as the
// claim UID, namespace and name a kubelet sends.
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "proxy/kubelet_side/dra/claim_preparer.h"
#include "proxy/kubelet_side/dra/slice_publisher.h"
#include "proxy/kube/json_shape.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)dpproxy::ValidateClaimRef({text, text, text});
    absl::StatusOr<nlohmann::json> parsed = dpproxy::ParseAnswer(text);
    if (!parsed.ok()) return 0;
    nlohmann::json& j = *parsed;
    (void)dpproxy::ServedVersions(j);
    (void)dpproxy::ParseClaim(j);
    absl::StatusOr<std::vector<nlohmann::json>> slices =
        dpproxy::SlicesOfPool(j, "node-1", "gpu.vendor.com", "node-1/vendor.com-gpu");
    if (slices.ok()) {
      for (const nlohmann::json& s : *slices) {
        (void)dpproxy::SliceProjection(s["spec"]);
        (void)s["spec"]["pool"].value("generation", int64_t{0});
        (void)s["metadata"].value("name", "");
        (void)s["metadata"].value("resourceVersion", "");
      }
    }
  } catch (const std::exception&) {
    std::abort();  // a reader threw: the defect this fuzzer looks for
  }
  return 0;
}
