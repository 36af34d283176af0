// --log_format=json: the binary writes nothing but JSON lines on stderr,
// glog's messages (ts, level, caller, msg) and lifecycle events (their
// fields as keys) alike; a bad format is refused.
#include "proxy/ops/json_log.h"

#include <signal.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "proxy/util/child_process.h"
#include "proxy/util/files.h"
#include "tests/testing/notify_socket.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using Json = nlohmann::json;

TEST(JsonLogLineTest, CarriesTimeLevelCallerAndMessage) {
  const absl::Time t = absl::FromUnixMillis(1700000000123);
  const Json j = Json::parse(JsonLogLine(1, "resource.cc", 367, t, "backend \"x\" lost\n"));
  EXPECT_EQ(j["ts"], "2023-11-14T22:13:20.123Z");
  EXPECT_EQ(j["level"], "warning");
  EXPECT_EQ(j["caller"], "resource.cc:367");
  EXPECT_EQ(j["msg"], "backend \"x\" lost\n");
  EXPECT_EQ(Json::parse(JsonLogLine(2, "a.cc", 1, t, "m"))["level"], "error");
  // Bytes that are not UTF-8 (a device ID from a plugin) do not break the line.
  const Json odd = Json::parse(JsonLogLine(0, "a.cc", 1, t, "id \xff\xfe"), nullptr,
                               /*allow_exceptions=*/false);
  EXPECT_TRUE(odd.is_object());
}

TEST(JsonLogBinaryTest, EveryLineOnStderrIsAJsonObject) {
  testing::ShortTempDir dir;
  ChildSpec spec;
  spec.argv = {testing::Runfile("proxy/dpproxy"), "--kubelet_root=" + dir.Sub("k"),
               "--plugin_dir=" + dir.Sub("p"), "--state_dir=" + dir.Sub("s"),
               "--status_file=", "--metrics_address=", "--log_format=json"};
  spec.output_path = dir.Sub("out.log");
  // dpproxy is up once it tells "systemd" so (after its first housekeeping
  // pass); then it is stopped.
  testing::NotifySocket notify(dir.Sub("notify.sock"));
  spec.env = {{"NOTIFY_SOCKET", notify.path()}};
  auto child = ChildProcess::Start(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(notify.WaitFor("READY=1", absl::Seconds(30)));
  (*child)->Signal(SIGTERM);
  const std::optional<int> status = (*child)->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0) << ChildProcess::DescribeExit(*status);
  absl::StatusOr<std::string> out = ReadFile(dir.Sub("out.log"));
  ASSERT_TRUE(out.ok()) << out.status();
  bool glog_line = false, event_line = false, signal_line = false;
  for (absl::string_view line : absl::StrSplit(*out, '\n', absl::SkipEmpty())) {
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
    EXPECT_TRUE(j.contains("ts") && j.contains("level") && j.contains("msg")) << line;
    if (j.contains("caller")) glog_line = true;
    if (j.value("event", "") == "backend_registration_listening") {
      event_line = true;
      EXPECT_EQ(j["socket"], dir.Sub("p/kubelet.sock")) << line;
    }
    if (j.value("msg", "") == "signal 15 received") signal_line = true;
  }
  EXPECT_TRUE(glog_line) << *out;
  EXPECT_TRUE(event_line) << *out;
  EXPECT_TRUE(signal_line) << *out;
}

TEST(JsonLogBinaryTest, AnUnknownFormatIsRefused) {
  testing::ShortTempDir dir;
  ChildSpec spec;
  spec.argv = {testing::Runfile("proxy/dpproxy"), "--log_format=xml"};
  spec.output_path = dir.Sub("out.log");
  auto child = ChildProcess::Start(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  const std::optional<int> status = (*child)->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2)
      << ChildProcess::DescribeExit(*status);
  EXPECT_NE(ReadFile(dir.Sub("out.log"))->find("--log_format=xml is not text or json"),
            std::string::npos);
}

}  // namespace
}  // namespace dpproxy
