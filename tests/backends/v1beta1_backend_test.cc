// The v1beta1 adapter, its calls driven through gRPC's generated mock stub
// (no socket): deadlines, error mapping, and answers that break the
// protocol refused with the backend named.
#include "backends/v1beta1/v1beta1_backend.h"

#include <grpcpp/client_context.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "proto/v1beta1/api_mock.grpc.pb.h"

namespace dpproxy {
namespace {

using ::testing::_;
using ::testing::DoAll;
using ::testing::HasSubstr;
using ::testing::Invoke;
using ::testing::Return;
using ::testing::SetArgPointee;
using ::testing::StrictMock;
using Stub = StrictMock<v1beta1::MockDevicePluginStub>;

constexpr char kEndpoint[] = "/var/lib/dpproxy/device-plugins/gpu.sock";

// The adapter with `stub` for its calls; `offered` as the plugin's options.
std::unique_ptr<V1Beta1Backend> Adapter(Stub** stub, bool preferred_offered = true) {
  auto owned = std::make_unique<Stub>();
  *stub = owned.get();
  v1beta1::DevicePluginOptions options;
  options.set_get_preferred_allocation_available(preferred_offered);
  return std::make_unique<V1Beta1Backend>("vendor.com/gpu", kEndpoint, nullptr, options,
                                          std::move(owned));
}

v1beta1::AllocateRequest TwoContainers() {
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("gpu-0");
  req.add_container_requests()->add_devices_ids("gpu-1");
  return req;
}

TEST(V1Beta1BackendTest, AllocatePassesThroughWithTheDeadline) {
  Stub* stub;
  auto backend = Adapter(&stub);
  v1beta1::AllocateResponse answer;
  (*answer.add_container_responses()->mutable_envs())["GPU"] = "0";
  (*answer.add_container_responses()->mutable_envs())["GPU"] = "1";
  const absl::Time before = absl::Now();
  EXPECT_CALL(*stub, Allocate(_, _, _))
      .WillOnce(Invoke([&](grpc::ClientContext* ctx, const v1beta1::AllocateRequest& req,
                           v1beta1::AllocateResponse* resp) {
        EXPECT_EQ(req.container_requests(1).devices_ids(0), "gpu-1");
        const absl::Time deadline = absl::FromChrono(ctx->deadline());
        EXPECT_GE(deadline, before + absl::Seconds(30));
        EXPECT_LE(deadline, absl::Now() + absl::Seconds(30));
        *resp = answer;
        return grpc::Status::OK;
      }));
  absl::StatusOr<v1beta1::AllocateResponse> got =
      backend->Allocate(TwoContainers(), absl::Seconds(30), nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->container_responses(1).envs().at("GPU"), "1");
}

TEST(V1Beta1BackendTest, AnAnswerWithTheWrongNumberOfContainersIsRefused) {
  Stub* stub;
  auto backend = Adapter(&stub);
  v1beta1::AllocateResponse one;
  one.add_container_responses();
  EXPECT_CALL(*stub, Allocate(_, _, _))
      .WillOnce(DoAll(SetArgPointee<2>(one), Return(grpc::Status::OK)));
  absl::StatusOr<v1beta1::AllocateResponse> got =
      backend->Allocate(TwoContainers(), absl::Seconds(30), nullptr);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr(absl::StrCat("backend ", kEndpoint,
                                     " answered Allocate with 1 container responses for 2")));
}

TEST(V1Beta1BackendTest, ErrorsNameTheBackendTheCallAndWhatHappened) {
  Stub* stub;
  auto backend = Adapter(&stub);
  EXPECT_CALL(*stub, Allocate(_, _, _))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "late")))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused")))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no such device")));
  absl::Status late = backend->Allocate(TwoContainers(), absl::Seconds(2), nullptr).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(late.message()), HasSubstr("did not answer Allocate within 2s"));
  absl::Status gone = backend->Allocate(TwoContainers(), absl::Seconds(2), nullptr).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(gone.message()),
              HasSubstr("is unavailable during Allocate: connection refused"));
  absl::Status refused = backend->Allocate(TwoContainers(), absl::Seconds(2), nullptr).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("failed Allocate: no such device"));
}

TEST(V1Beta1BackendTest, PreferredAllocationIsNeverAskedOfAPluginThatDoesNotOfferIt) {
  Stub* stub;
  auto backend = Adapter(&stub, /*preferred_offered=*/false);
  // A StrictMock: any call to the stub would fail the test.
  absl::Status s =
      backend->GetPreferredAllocation(v1beta1::PreferredAllocationRequest(), absl::Seconds(1),
                                      nullptr)
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
}

TEST(V1Beta1BackendTest, PreStartErrorsComeBackAndSuccessIsOk) {
  Stub* stub;
  auto backend = Adapter(&stub);
  EXPECT_CALL(*stub, PreStartContainer(_, _, _))
      .WillOnce(Return(grpc::Status::OK))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::INTERNAL, "reset failed")));
  EXPECT_TRUE(backend->PreStartContainer({}, absl::Seconds(1), nullptr).ok());
  absl::Status s = backend->PreStartContainer({}, absl::Seconds(1), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("failed PreStartContainer: reset failed"));
}

}  // namespace
}  // namespace dpproxy
