#include "proxy/events/telemetry.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Scrape(const Telemetry& t) {
  return prometheus::TextSerializer().Serialize(t.registry()->Collect());
}

// One series per label set, however often (and from however many threads)
// it is observed; a label that differs makes a series of its own, and no
// label's value leaks into another's.
TEST(TelemetryTest, EachLabelSetIsOneSeries) {
  Telemetry t;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int n = 0; n < 250; ++n) {
        t.ObserveRpc("kubelet", "Allocate", "vendor.com/gpu", "v1beta1", "v1alpha", "OK",
                     absl::Microseconds(120));
      }
    });
  }
  for (auto& th : threads) th.join();
  t.ObserveRpc("kubelet", "Allocate", "vendor.com/gpu", "v1beta1", "v1alpha", "UNAVAILABLE",
               absl::Milliseconds(3));
  // The same values split at another place are another label set.
  t.ObserveRpc("backend", "Allocate", "vendor.com/gpu", "v1beta1", "", "OK",
               absl::Microseconds(60));
  t.ObserveRpc("backend", "Allocate", "vendor.com/gpu", "", "v1beta1", "OK",
               absl::Microseconds(60));
  const std::string text = Scrape(t);
  EXPECT_THAT(text, HasSubstr("dpproxy_rpc_duration_seconds_count{backend_api=\"v1alpha\","
                              "code=\"OK\",kubelet_api=\"v1beta1\",method=\"Allocate\","
                              "resource=\"vendor.com/gpu\",side=\"kubelet\"} 1000"));
  EXPECT_THAT(text, HasSubstr("dpproxy_rpc_duration_seconds_count{backend_api=\"v1alpha\","
                              "code=\"UNAVAILABLE\",kubelet_api=\"v1beta1\",method=\"Allocate\","
                              "resource=\"vendor.com/gpu\",side=\"kubelet\"} 1"));
  EXPECT_THAT(text, HasSubstr("dpproxy_rpc_duration_seconds_count{backend_api=\"\","
                              "code=\"OK\",kubelet_api=\"v1beta1\",method=\"Allocate\","
                              "resource=\"vendor.com/gpu\",side=\"backend\"} 1"));
  EXPECT_THAT(text, HasSubstr("dpproxy_rpc_duration_seconds_count{backend_api=\"v1beta1\","
                              "code=\"OK\",kubelet_api=\"\",method=\"Allocate\","
                              "resource=\"vendor.com/gpu\",side=\"backend\"} 1"));
  // 120 us falls in the bucket that ends at 200 us (50 us doubling), not
  // in the one before.
  EXPECT_THAT(text, HasSubstr("dpproxy_rpc_duration_seconds_bucket{backend_api=\"v1alpha\","
                              "code=\"OK\",kubelet_api=\"v1beta1\",method=\"Allocate\","
                              "resource=\"vendor.com/gpu\",side=\"kubelet\",le=\"0.0002\"} "
                              "1000"));
  EXPECT_THAT(text, HasSubstr("dpproxy_rpc_duration_seconds_bucket{backend_api=\"v1alpha\","
                              "code=\"OK\",kubelet_api=\"v1beta1\",method=\"Allocate\","
                              "resource=\"vendor.com/gpu\",side=\"kubelet\",le=\"0.0001\"} 0"));
  EXPECT_THAT(text, Not(HasSubstr("side=\"kubelet\"} 1001")));
}

}  // namespace
}  // namespace dpproxy
