#include "backends/backend_base.h"

#include "absl/strings/str_cat.h"

namespace dpproxy {

// A backend call's error, naming the backend and the call.
absl::Status CallError(const std::string& endpoint, const char* call, const grpc::Status& s,
                       absl::Duration timeout) {
  switch (s.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(
          absl::StrCat("backend ", endpoint, " did not answer ", call, " within ",
                       absl::FormatDuration(timeout)));
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
      return absl::UnavailableError(absl::StrCat("backend ", endpoint, " is unavailable during ",
                                                 call, ": ", s.error_message()));
    default:
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("backend ", endpoint, " failed ", call, ": ",
                                       s.error_message()));
  }
}

std::unique_ptr<grpc::ClientContext> CallContext(const grpc::ServerContextBase* caller,
                                                 absl::Duration timeout) {
  std::unique_ptr<grpc::ClientContext> ctx =
      caller == nullptr ? std::make_unique<grpc::ClientContext>()
                        : grpc::ClientContext::FromServerContext(*caller);
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

}  // namespace dpproxy
