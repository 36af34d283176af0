// The simulator's own copy of the kubelet's registration checks and error
// texts, against what the kubelet's sources say (devicemanager's api.go
// and server.go, apimachinery's validation, Go's strconv.Quote).
#include "tools/kubelet_sim/kubelet_texts.h"

#include <string>

#include "gtest/gtest.h"

namespace dpproxy::sim {
namespace {

TEST(KubeletTextsTest, QuotesAsGoDoes) {
  EXPECT_EQ(GoQuote("v1beta1"), "\"v1beta1\"");
  EXPECT_EQ(GoQuote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(GoQuote("\a\b\f\n\r\t\v"), "\"\\a\\b\\f\\n\\r\\t\\v\"");
  EXPECT_EQ(GoQuote(std::string("x\0y\x7f", 4)), "\"x\\x00y\\x7f\"");
  // Invalid UTF-8 byte by byte; a C1 control as a rune; other runes kept.
  EXPECT_EQ(GoQuote("\xff\xc3"), "\"\\xff\\xc3\"");
  EXPECT_EQ(GoQuote("\xc2\x85"), "\"\\u0085\"");
  EXPECT_EQ(GoQuote("gr\xc3\xbc\xc3\x9f"), "\"gr\xc3\xbc\xc3\x9f\"");
  // Overlong and surrogate encodings are invalid.
  EXPECT_EQ(GoQuote("\xc0\xaf"), "\"\\xc0\\xaf\"");
  EXPECT_EQ(GoQuote("\xed\xa0\x80"), "\"\\xed\\xa0\\x80\"");
  // Whole, however long: the kubelet does not cut what it echoes.
  EXPECT_EQ(GoQuote(std::string(5000, 'v')).size(), 5002u);
}

TEST(KubeletTextsTest, ExtendedResourceNames) {
  for (const char* ok : {"vendor.com/gpu", "a.b-c.io/x_y.z-1", "nvidia.com/mig-1g.5gb",
                         "x.io/G"}) {
    EXPECT_TRUE(IsExtendedResourceName(ok)) << ok;
    EXPECT_TRUE(CheckResourceName(ok).ok()) << ok;
  }
  const std::string long_name = "vendor.com/" + std::string(63, 'g');
  EXPECT_TRUE(IsExtendedResourceName(long_name));
  for (const std::string& bad :
       {std::string("gpu"), std::string("kubernetes.io/gpu"), std::string("a.kubernetes.io/gpu"),
        std::string("requests.vendor.com/gpu"), std::string("Vendor.com/gpu"),
        std::string("vendor.com/"), std::string("/gpu"), std::string("vendor.com/-gpu"),
        std::string("vendor.com/gpu-"), std::string("a/b/c"), std::string("vendor..com/gpu"),
        long_name + "g", std::string("vendor.com/g pu")}) {
    EXPECT_FALSE(IsExtendedResourceName(bad)) << bad;
  }
  absl::Status s = CheckResourceName("gpu");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(s.message(), "the ResourceName \"gpu\" is invalid");
}

TEST(KubeletTextsTest, Dns1123Labels) {
  EXPECT_TRUE(IsDns1123Label("gpu-0"));
  EXPECT_TRUE(IsDns1123Label("0"));
  EXPECT_TRUE(IsDns1123Label(std::string(63, 'a')));
  EXPECT_FALSE(IsDns1123Label(std::string(64, 'a')));
  EXPECT_FALSE(IsDns1123Label(""));
  EXPECT_FALSE(IsDns1123Label("GPU-0"));
  EXPECT_FALSE(IsDns1123Label("gpu.0"));  // a subdomain, not a label
  EXPECT_FALSE(IsDns1123Label("-gpu"));
  EXPECT_FALSE(IsDns1123Label("gpu-"));
  EXPECT_FALSE(IsDns1123Label("gpu_0"));
}

TEST(KubeletTextsTest, VersionErrorsAreTheKubeletsOwn) {
  EXPECT_TRUE(CheckV1Beta1Version("v1beta1").ok());
  EXPECT_EQ(CheckV1Beta1Version("v1").message(),
            "requested API version \"v1\" is not supported by kubelet. Supported version is "
            "[\"v1beta1\"]");
  EXPECT_TRUE(CheckV1AlphaVersion("v1alpha2").ok());
  EXPECT_EQ(CheckV1AlphaVersion("v1alpha1").message(),
            "requested API version \"v1alpha1\" is not supported by kubelet. Supported version "
            "is \"v1alpha2\"");
  EXPECT_TRUE(CheckWatcherVersions({"v1alpha", "v1beta1"}).ok());
  EXPECT_EQ(CheckWatcherVersions({"v1", "v2"}).message(),
            "manager version, v1beta1, is not among plugin supported versions [v1 v2]");
  EXPECT_EQ(CheckWatcherVersions({}).message(),
            "manager version, v1beta1, is not among plugin supported versions []");
}

}  // namespace
}  // namespace dpproxy::sim
