#include "proxy/ops/json_log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dpproxy {

namespace {

enum class Format { kText, kJson };

class KlogSink : public google::LogSink {
 public:
  explicit KlogSink(Format format) : format_(format) {}

  void send(google::LogSeverity severity, const char* /*full_filename*/,
            const char* base_filename, int line, const google::LogMessageTime& t,
            const char* message, size_t message_len) override {
    const absl::Time when = absl::FromUnixSeconds(t.timestamp()) + absl::Microseconds(t.usec());
    const absl::string_view text(message, message_len);
    std::string out =
        format_ == Format::kJson
            ? JsonLogLine(severity, base_filename, line, when, text)
            : TextLogLine(severity, base_filename, line, when,
                          static_cast<int>(::syscall(SYS_gettid)), text);
    out += '\n';
    // One write per line: lines from several threads never interleave.
    fwrite(out.data(), 1, out.size(), stderr);
  }

 private:
  const Format format_;
};

void UseSink(Format format) {
  static KlogSink* sink = new KlogSink(format);
  // glog's own outputs off: no glog header on stderr, no files.
  FLAGS_logtostderr = false;
  FLAGS_alsologtostderr = false;
  FLAGS_stderrthreshold = google::NUM_SEVERITIES;
  for (int s = 0; s < google::NUM_SEVERITIES; ++s) google::SetLogDestination(s, "");
  google::AddLogSink(sink);
}

int Clamp(int severity) { return severity < 0 ? 0 : severity > 3 ? 3 : severity; }

}  // namespace

std::string JsonLogLine(int severity, absl::string_view file, int line, absl::Time time,
                        absl::string_view message) {
  severity = Clamp(severity);
  nlohmann::ordered_json j;
  j["ts"] = absl::ToDoubleSeconds(time - absl::UnixEpoch());
  j["caller"] = std::string(file) + ":" + std::to_string(line);
  j["msg"] = std::string(message);
  if (severity >= 2) {
    j["err"] = std::string(message);  // an error carries "err", not "v"
  } else {
    j["v"] = 0;
  }
  if (severity > 0) j["level"] = severity == 1 ? "warning" : severity == 2 ? "error" : "fatal";
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

// A message as one line: control characters (a newline in a name an API
// server or a plugin sent, say) are escaped, so no message can forge a
// line of its own. Tabs stay.
std::string OneLine(absl::string_view message) {
  std::string out;
  out.reserve(message.size());
  for (const char c : message) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if ((u < 0x20 && c != '\t') || u == 0x7f) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", u));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string TextLogLine(int severity, absl::string_view file, int line, absl::Time time,
                        int thread, absl::string_view message) {
  constexpr char kLetters[] = "IWEF";
  return absl::StrFormat("%c%s %7d %s:%d] %s", kLetters[Clamp(severity)],
                         absl::FormatTime("%m%d %H:%M:%E6S", time, absl::LocalTimeZone()),
                         thread, file, line, OneLine(message));
}

void UseJsonLogs() { UseSink(Format::kJson); }
void UseTextLogs() { UseSink(Format::kText); }

}  // namespace dpproxy
