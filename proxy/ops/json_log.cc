#include "proxy/ops/json_log.h"

#include <cstdio>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

namespace dpproxy {

namespace {

constexpr const char* kLevels[] = {"info", "warning", "error", "fatal"};

class JsonSink : public google::LogSink {
 public:
  void send(google::LogSeverity severity, const char* /*full_filename*/,
            const char* base_filename, int line, const google::LogMessageTime& t,
            const char* message, size_t message_len) override {
    const absl::Time when = absl::FromUnixSeconds(t.timestamp()) + absl::Microseconds(t.usec());
    std::string out = JsonLogLine(severity, base_filename, line, when,
                                  absl::string_view(message, message_len));
    out += '\n';
    // One write per line: lines from several threads never interleave.
    fwrite(out.data(), 1, out.size(), stderr);
  }
};

}  // namespace

std::string JsonLogLine(int severity, absl::string_view file, int line, absl::Time time,
                        absl::string_view message) {
  nlohmann::ordered_json j;
  j["ts"] = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone());
  j["level"] = kLevels[severity < 0 ? 0 : severity > 3 ? 3 : severity];
  j["caller"] = std::string(file) + ":" + std::to_string(line);
  j["msg"] = std::string(message);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void UseJsonLogs() {
  static JsonSink* sink = new JsonSink();
  // glog's own outputs off: no text on stderr, no files.
  FLAGS_logtostderr = false;
  FLAGS_alsologtostderr = false;
  FLAGS_stderrthreshold = google::NUM_SEVERITIES;
  for (int s = 0; s < google::NUM_SEVERITIES; ++s) google::SetLogDestination(s, "");
  google::AddLogSink(sink);
}

}  // namespace dpproxy
