// dpproxy's logs in klog's formats: --log_format=json writes nothing but
// klog JSON lines on stderr, glog's messages and lifecycle events (their
// fields as keys) alike; the text format has klog's header on every line;
// a bad format is refused.
#include "proxy/ops/json_log.h"

#include <signal.h>

#include <regex>
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

// The fields klog's JSON format has, as its consumers read them: "ts"
// (float seconds), "caller", "msg", "v" on info lines, "err" on errors.
TEST(JsonLogLineTest, IsKlogsJson) {
  const absl::Time t = absl::FromUnixMicros(1700000000123456);
  const Json j = Json::parse(JsonLogLine(0, "resource.cc", 367, t, "backend \"x\" lost\n"));
  ASSERT_TRUE(j["ts"].is_number_float());
  EXPECT_NEAR(j["ts"].get<double>(), 1700000000.123456, 1e-6);
  EXPECT_EQ(j["caller"], "resource.cc:367");
  EXPECT_EQ(j["msg"], "backend \"x\" lost\n");
  EXPECT_EQ(j["v"], 0);
  EXPECT_FALSE(j.contains("err"));
  EXPECT_FALSE(j.contains("level"));  // info is klog's default
  const Json warning = Json::parse(JsonLogLine(1, "a.cc", 1, t, "m"));
  EXPECT_EQ(warning["v"], 0);
  EXPECT_EQ(warning["level"], "warning");
  const Json error = Json::parse(JsonLogLine(2, "a.cc", 1, t, "cannot write"));
  EXPECT_EQ(error["err"], "cannot write");
  EXPECT_FALSE(error.contains("v"));
  EXPECT_EQ(error["level"], "error");
  // Bytes that are not UTF-8 (a device ID from a plugin) do not break the line.
  const Json odd = Json::parse(JsonLogLine(0, "a.cc", 1, t, "id \xff\xfe"), nullptr,
                               /*allow_exceptions=*/false);
  EXPECT_TRUE(odd.is_object());
}

// klog's text header, as its parsers match it: severity letter, MMDD,
// hh:mm:ss.uuuuuu, the thread ID 7 wide, file:line] (no year, unlike glog).
constexpr char kKlogHeader[] = R"(^[IWEF][01][0-9][0-3][0-9] [0-2][0-9]:[0-5][0-9]:[0-6][0-9]\.[0-9]{6} +[0-9]+ [^ :]+:[0-9]+\] )";

// A name with a newline (a pool name an API server sent) cannot forge a
// line of its own: control characters are escaped, tabs stay.
TEST(TextLogLineTest, ControlCharactersCannotForgeALine) {
  const absl::Time t = absl::FromUnixSeconds(1764259141);
  const std::string line = TextLogLine(
      0, "dra_side.cc", 1, t, 7, "pool \"a\nE1128 00:00:00.000000 1 forged.cc:1] x\"\r\x01\x7f\tend");
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_NE(line.find("pool \"a\\nE1128 00:00:00.000000 1 forged.cc:1] x\"\\r\\x01\\x7f\tend"),
            std::string::npos)
      << line;
}

TEST(TextLogLineTest, IsKlogsHeader) {
  const absl::Time t = absl::FromCivil(absl::CivilSecond(2026, 11, 22, 17, 59, 1),
                                       absl::LocalTimeZone()) +
                       absl::Microseconds(123456);
  EXPECT_EQ(TextLogLine(1, "resource.cc", 367, t, 4242, "backend lost"),
            "W1122 17:59:01.123456    4242 resource.cc:367] backend lost");
  EXPECT_TRUE(std::regex_search(TextLogLine(0, "a.cc", 1, t, 1, "m"), std::regex(kKlogHeader)));
  EXPECT_EQ(TextLogLine(2, "a.cc", 1, t, 1, "m")[0], 'E');
}

// Starts dpproxy with `flags`, waits until it tells "systemd" it is up
// (after its first housekeeping pass), stops it with SIGTERM and returns
// what it wrote on stdout and stderr.
void StartAndStop(const testing::ShortTempDir& dir, const std::vector<std::string>& flags,
                  std::string* out) {
  ChildSpec spec;
  spec.argv = {testing::Runfile("proxy/dpproxy"), "--kubelet_root=" + dir.Sub("k"),
               "--plugin_dir=" + dir.Sub("p"), "--state_dir=" + dir.Sub("s"),
               "--status_file=", "--metrics_address="};
  spec.argv.insert(spec.argv.end(), flags.begin(), flags.end());
  spec.output_path = dir.Sub("out.log");
  testing::NotifySocket notify(dir.Sub("notify.sock"));
  spec.env = {{"NOTIFY_SOCKET", notify.path()}};
  auto child = ChildProcess::Start(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(notify.WaitFor("READY=1", absl::Seconds(30)));
  (*child)->Signal(SIGTERM);
  const std::optional<int> status = (*child)->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0) << ChildProcess::DescribeExit(*status);
  absl::StatusOr<std::string> text = ReadFile(dir.Sub("out.log"));
  ASSERT_TRUE(text.ok()) << text.status();
  *out = *std::move(text);
}

TEST(TextLogBinaryTest, EveryLineOnStderrHasKlogsHeader) {
  testing::ShortTempDir dir;
  std::string out;
  ASSERT_NO_FATAL_FAILURE(StartAndStop(dir, {}, &out));
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    EXPECT_TRUE(std::regex_search(std::string(line), std::regex(kKlogHeader)))
        << "not a klog line: " << line;
    ++lines;
  }
  EXPECT_GT(lines, 2) << out;
  EXPECT_NE(out.find("] signal 15 received"), std::string::npos) << out;
}

// At the default verbosity one line per happening: its log message, and no
// second line for the lifecycle event beside it; with -v=1 the events come
// too, as info lines of verbosity 1 with their fields as keys.
TEST(JsonLogBinaryTest, EveryLineOnStderrIsAJsonObjectOneLinePerHappening) {
  testing::ShortTempDir dir;
  std::string out;
  ASSERT_NO_FATAL_FAILURE(StartAndStop(dir, {"--log_format=json"}, &out));
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
    EXPECT_FALSE(j.contains("event")) << "an event line at the default verbosity: " << line;
  }
  testing::ShortTempDir verbose;
  ASSERT_NO_FATAL_FAILURE(StartAndStop(verbose, {"--log_format=json", "-v=1"}, &out));
  bool glog_line = false, event_line = false, signal_line = false;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
    EXPECT_TRUE(j.contains("ts") && j["ts"].is_number() && j.contains("msg")) << line;
    EXPECT_TRUE(j.contains("v") || j.contains("err")) << line;
    if (j.contains("caller")) glog_line = true;
    if (j.value("event", "") == "backend_registration_listening") {
      event_line = true;
      EXPECT_EQ(j["socket"], verbose.Sub("p/kubelet.sock")) << line;
      EXPECT_EQ(j["v"], 1) << line;
      EXPECT_EQ(j["msg"], "backend_registration_listening") << line;
    }
    if (j.value("msg", "") == "signal 15 received") signal_line = true;
  }
  EXPECT_TRUE(glog_line) << out;
  EXPECT_TRUE(event_line) << out;
  EXPECT_TRUE(signal_line) << out;
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
