// The HTTPS module's loader: it finds this build's module, and refuses a
// file that is not a module or is one of another build, saying why.
#include "proxy/kube/https_loader.h"

#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;

// The module this test's runfiles hold (the first candidate that exists).
std::string FoundModule() {
  for (const std::string& path : HttpsModuleCandidates()) {
    if (PathExists(path)) return path;
  }
  return "";
}

TEST(HttpsLoaderTest, LooksBesideTheExecutableFirstThenWhereThePackageInstallsIt) {
  const std::vector<std::string> c = HttpsModuleCandidates();
  ASSERT_GE(c.size(), 3u);
  const std::optional<std::string> exe = ExecutableOf("self");
  ASSERT_TRUE(exe.has_value());
  const std::string dir = DirName(*exe);
  EXPECT_EQ(c[0], dir + "/dpproxy-https.so");
  EXPECT_EQ(c[1], DirName(dir) + "/lib/dpproxy/dpproxy-https.so");
  EXPECT_EQ(c[2], *exe + ".runfiles/dpproxy/proxy/kube/dpproxy-https.so");
}

TEST(HttpsLoaderTest, LoadsThisBuildsModuleOnce) {
  absl::StatusOr<const https::Module*> m = HttpsModule();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*HttpsModule(), *m);
  EXPECT_FALSE((*m)->has_certificate("not a certificate"));
  // An exchange that cannot connect says so, as an answer.
  https::Request req;
  req.https = false;
  req.host = "127.0.0.1";
  req.port = 1;  // nobody listens
  req.method = "GET";
  req.path = "/";
  req.timeout_ms = 2000;
  https::Answer a;
  (*m)->exchange(req, &a);
  EXPECT_EQ(a.outcome, https::Answer::Outcome::kTransport);
  EXPECT_EQ(a.error, "cannot connect");
}

TEST(HttpsLoaderTest, RefusesAModuleOfAnotherBuild) {
  const std::string path = FoundModule();
  ASSERT_FALSE(path.empty());
  absl::StatusOr<const https::Module*> m = LoadHttpsModule(path, "0123456789abcdef");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("comes from another build"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr(HttpsModuleAbi()));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("0123456789abcdef"));
}

TEST(HttpsLoaderTest, RefusesASharedObjectThatIsNotAModule) {
  const char* runfiles = ::getenv("TEST_SRCDIR");
  ASSERT_NE(runfiles, nullptr);
  const std::string other = std::string(runfiles) + "/dpproxy/tests/kube/not_a_module.so";
  ASSERT_TRUE(PathExists(other)) << other;
  absl::StatusOr<const https::Module*> m = LoadHttpsModule(other, HttpsModuleAbi());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("is not a dpproxy HTTPS module"));
}

TEST(HttpsLoaderTest, AFileThatIsNoSharedObjectIsNamedWithTheLoadersReason) {
  const std::string path = "/proc/self/status";
  absl::StatusOr<const https::Module*> m = LoadHttpsModule(path, HttpsModuleAbi());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("cannot load dpproxy's HTTPS module /proc/self/status: "));
}

}  // namespace
}  // namespace dpproxy
