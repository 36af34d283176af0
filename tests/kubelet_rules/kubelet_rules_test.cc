#include "proxy/kubelet_rules/kubelet_rules.h"

#include "gtest/gtest.h"

namespace dpproxy {
namespace {

TEST(KubeletRulesTest, AcceptsExtendedResourceNames) {
  for (const char* name : {"vendor.com/gpu", "nvidia.com/gpu", "example.com/foo-bar_1.x",
                           "a.b.c/d", "intel.com/qat_generic"}) {
    EXPECT_TRUE(IsExtendedResourceName(name)) << name;
    EXPECT_TRUE(ValidateResourceName(name).ok()) << name;
  }
}

TEST(KubeletRulesTest, RejectsNativeAndMalformedNames) {
  for (const char* name : {
           "gpu",                      // no domain: a native resource
           "kubernetes.io/gpu",        // native namespace
           "foo.kubernetes.io/gpu",    // still native
           "requests.vendor.com/gpu",  // quota prefix
           "Vendor.com/gpu",           // upper-case domain
           "vendor.com/",              // empty name
           "vendor.com/-gpu",          // must start alphanumeric
           "vendor.com/gpu-",          // must end alphanumeric
           "vendor.com/g/pu",          // two slashes
           "vendor..com/gpu",          // empty label
           "vendor.com/a b",           // space
           "",
       }) {
    EXPECT_FALSE(IsExtendedResourceName(name)) << name;
  }
  std::string long_name = "vendor.com/" + std::string(64, 'a');
  EXPECT_FALSE(IsExtendedResourceName(long_name));
  EXPECT_TRUE(IsExtendedResourceName("vendor.com/" + std::string(63, 'a')));
}

TEST(KubeletRulesTest, ErrorTextsAreTheKubeletsOwn) {
  absl::Status s = ValidateResourceName("badname");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(s.message(), "the ResourceName \"badname\" is invalid");

  s = ValidateV1Beta1Version("v1alpha");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(s.message(),
            "requested API version \"v1alpha\" is not supported by kubelet. Supported "
            "version is [\"v1beta1\"]");
  EXPECT_TRUE(ValidateV1Beta1Version("v1beta1").ok());

  s = ValidateV1AlphaVersion("v1beta1");
  EXPECT_EQ(s.message(),
            "requested API version \"v1beta1\" is not supported by kubelet. Supported "
            "version is \"v1alpha2\"");
  EXPECT_TRUE(ValidateV1AlphaVersion("v1alpha2").ok());
  EXPECT_FALSE(ValidateV1AlphaVersion("0.1").ok());  // 1.8's version is not 1.9's

  s = ValidateWatcherVersions({"v1alpha2", "v1"});
  EXPECT_EQ(s.message(),
            "manager version, v1beta1, is not among plugin supported versions [v1alpha2 v1]");
  EXPECT_TRUE(ValidateWatcherVersions({"v1", "v1beta1"}).ok());
  EXPECT_FALSE(ValidateWatcherVersions({}).ok());
}

TEST(KubeletRulesTest, GoQuoteEscapes) {
  EXPECT_EQ(GoQuote("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\x01\"");
  // The escapes Go gives names of their own, as the kubelet writes them.
  EXPECT_EQ(GoQuote("\a\b\f\t\v\x1b"), "\"\\a\\b\\f\\t\\v\\x1b\"");
  EXPECT_EQ(GoStringSlice({}), "[]");
}

TEST(KubeletRulesTest, UntrustedInputIsEchoedOnlyUpToABound) {
  const std::string huge(100 * 1024, 'v');
  absl::Status s = ValidateV1Beta1Version(huge);
  EXPECT_LT(s.message().size(), 600u);
  EXPECT_NE(s.message().find("... (102400 bytes)"), absl::string_view::npos);
  EXPECT_EQ(GoQuote("short"), "\"short\"");  // short strings as Go quotes them
  // Found by the fuzzer: a plugin's version list was echoed whole.
  absl::Status w = ValidateWatcherVersions({huge, huge, huge});
  EXPECT_LT(w.message().size(), 1200u);
  EXPECT_LT(GoStringSlice(std::vector<std::string>(100, "v")).size(), 100u);
  EXPECT_EQ(GoStringSlice({"a", "b"}), "[a b]");
}

TEST(KubeletRulesTest, DeviceIds) {
  EXPECT_TRUE(ValidateDeviceId("GPU-0b3c").ok());
  EXPECT_EQ(ValidateDeviceId("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateDeviceId(std::string("a\0b", 3)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateDeviceId("a\nb").code(), absl::StatusCode::kInvalidArgument);
}

TEST(KubeletRulesTest, EndpointNames) {
  EXPECT_EQ(ValidateEndpointName(std::string("gpu\0.sock", 9)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateEndpointName("gpu\n.sock").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ValidateEndpointName("kubelet.sock").message().find("registration socket itself"),
            absl::string_view::npos);
  EXPECT_TRUE(ValidateEndpointName("gpu.sock").ok());
  EXPECT_TRUE(ValidateEndpointName("sub/gpu.sock").ok());
  EXPECT_EQ(ValidateEndpointName("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateEndpointName("/abs.sock").code(), absl::StatusCode::kInvalidArgument);
  absl::Status s = ValidateEndpointName("../../etc/x.sock");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("escapes"), absl::string_view::npos);
}

}  // namespace
}  // namespace dpproxy
