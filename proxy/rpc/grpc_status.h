// File: grpc_status.h
//
// Conversions between absl::Status and grpc::Status at RPC edges (the code
// numbers are the same), and how the tools print a gRPC error.
#ifndef DPPROXY_PROXY_RPC_GRPC_STATUS_H_
#define DPPROXY_PROXY_RPC_GRPC_STATUS_H_

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dpproxy {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

// "UNIMPLEMENTED: unknown service v1beta1.Registration", the way the tools
// print a gRPC error for people.
std::string DescribeGrpcStatus(const grpc::Status& s);

// Name of a gRPC status code, e.g. "UNAVAILABLE".
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_RPC_GRPC_STATUS_H_
