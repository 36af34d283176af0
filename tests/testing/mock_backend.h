// File: mock_backend.h
//
// A gMock Backend for unit tests of the core and the kubelet side: no
// socket, no plugin. Use it as a StrictMock so that a call the test did not
// expect (a second Allocate, a Stop that should not happen) fails.
//
//   auto b = std::make_shared<StrictMock<MockBackend>>("vendor.com/gpu");
//   EXPECT_CALL(*b, Start(_)).WillOnce(SaveArg<0>(&b->callbacks));
//   resource.AttachBackend(b);
//   b->callbacks.on_devices(DeviceList::FromDevices(devices));  // as the stream reader would
#ifndef DPPROXY_TESTS_TESTING_MOCK_BACKEND_H_
#define DPPROXY_TESTS_TESTING_MOCK_BACKEND_H_

#include <atomic>
#include <string>

#include <gmock/gmock.h>

#include "proxy/core/backend.h"

namespace dpproxy {
namespace testing {

class MockBackend : public Backend {
 public:
  // api(), endpoint(), resource() and options() answer these by default
  // (they are accessors: counting them would only make tests brittle).
  explicit MockBackend(std::string resource = "vendor.com/gpu",
                       std::string endpoint = "/run/mock.sock",
                       ApiVersion api = ApiVersion::kV1Beta1)
      : resource_(std::move(resource)), endpoint_(std::move(endpoint)), api_(api) {}

  ApiVersion api() const override { return api_; }
  const std::string& endpoint() const override { return endpoint_; }
  const std::string& resource() const override { return resource_; }
  v1beta1::DevicePluginOptions options() const override { return plugin_options; }

  MOCK_METHOD(void, Start, (BackendCallbacks callbacks), (override));
  MOCK_METHOD(absl::StatusOr<v1beta1::AllocateResponse>, Allocate,
              (const v1beta1::AllocateRequest& request, absl::Duration timeout,
               const grpc::ServerContextBase* caller),
              (override));
  MOCK_METHOD(absl::StatusOr<v1beta1::PreferredAllocationResponse>, GetPreferredAllocation,
              (const v1beta1::PreferredAllocationRequest& request, absl::Duration timeout,
               const grpc::ServerContextBase* caller),
              (override));
  MOCK_METHOD(absl::Status, PreStartContainer,
              (const v1beta1::PreStartContainerRequest& request, absl::Duration timeout,
               const grpc::ServerContextBase* caller),
              (override));
  MOCK_METHOD(void, Stop, (), (override));
  // The watchdog's ask: answered at once with `probe_answer` (not a mock
  // method: a resource's pass asks now and then, which tests of other
  // things need not spell out).
  void ProbeAsync(absl::Duration, std::function<void(absl::Status)> done) override {
    ++probes;
    done(probe_answer);
  }

  v1beta1::DevicePluginOptions plugin_options;
  absl::Status probe_answer;
  std::atomic<int> probes{0};
  // Where a test keeps what Start() was given.
  BackendCallbacks callbacks;

 private:
  const std::string resource_;
  const std::string endpoint_;
  const ApiVersion api_;
};

}  // namespace testing
}  // namespace dpproxy

#endif  // DPPROXY_TESTS_TESTING_MOCK_BACKEND_H_
