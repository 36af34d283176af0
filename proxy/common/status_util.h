// File: status_util.h
//
// Small helpers around absl::Status for Abseil 20220623, which has neither
// ABSL_RETURN_IF_ERROR nor ABSL_ASSIGN_OR_RETURN, plus the conversions to
// and from grpc::Status used at RPC edges (the code numbers are the same).
#ifndef DPPROXY_PROXY_COMMON_STATUS_UTIL_H_
#define DPPROXY_PROXY_COMMON_STATUS_UTIL_H_

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DPP_STATUS_CONCAT_INNER_(a, b) a##b
#define DPP_STATUS_CONCAT_(a, b) DPP_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` is not OK.
#define DPP_RETURN_IF_ERROR(expr)                  \
  do {                                             \
    ::absl::Status dpp_status_ = (expr);           \
    if (!dpp_status_.ok()) return dpp_status_;     \
  } while (0)

// `lhs = *expr` or returns the error of `expr`.
#define DPP_ASSIGN_OR_RETURN(lhs, expr)                                      \
  auto DPP_STATUS_CONCAT_(dpp_statusor_, __LINE__) = (expr);                 \
  if (!DPP_STATUS_CONCAT_(dpp_statusor_, __LINE__).ok())                     \
    return DPP_STATUS_CONCAT_(dpp_statusor_, __LINE__).status();             \
  lhs = std::move(*DPP_STATUS_CONCAT_(dpp_statusor_, __LINE__))

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

#endif  // DPPROXY_PROXY_COMMON_STATUS_UTIL_H_
