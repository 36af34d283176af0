#include "proxy/rpc/grpc_status.h"

#include "absl/strings/str_cat.h"

namespace dpproxy {

std::string GrpcCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

std::string DescribeGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return "OK";
  return absl::StrCat(GrpcCodeName(s.error_code()), ": ", s.error_message());
}

}  // namespace dpproxy
