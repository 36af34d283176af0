#include "proxy/events/event_log.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "proxy/util/files.h"

namespace dpproxy {

EventLog::EventLog(std::string source, size_t history)
    : source_(std::move(source)), history_(std::max<size_t>(1, history)) {}

EventLog::~EventLog() {
  absl::MutexLock lock(&mu_);
  if (file_ != nullptr) fclose(file_);
}

absl::Status EventLog::OpenFile(const std::string& path) {
  // Never through a link planted at `path`; mode 0640 whatever the umask.
  absl::StatusOr<int> fd = OpenOwnFileForAppend(path, 0640);
  if (!fd.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open event file: ", fd.status().message()));
  }
  FILE* f = fdopen(*fd, "a");
  if (f == nullptr) {
    ::close(*fd);
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open event file ", path, ": ", ErrnoText(errno)));
  }
  absl::MutexLock lock(&mu_);
  if (file_ != nullptr) fclose(file_);
  file_ = f;
  return absl::OkStatus();
}

void EventLog::SetEcho(bool echo) {
  absl::MutexLock lock(&mu_);
  echo_ = echo;
}

namespace {

// RFC 3339 in UTC with milliseconds ("2026-11-27T21:28:19.123Z"). The part
// up to the second is kept per thread and remade when the second changes.
std::string EventTimestamp(absl::Time now) {
  struct Cached {
    int64_t second = std::numeric_limits<int64_t>::min();
    std::string head;
  };
  thread_local Cached cached;
  const int64_t ms = absl::ToUnixMillis(now);
  const int64_t second = ms >= 0 ? ms / 1000 : (ms - 999) / 1000;
  if (second != cached.second) {
    cached.head = absl::FormatTime("%Y-%m-%dT%H:%M:%S", absl::FromUnixSeconds(second),
                                   absl::UTCTimeZone());
    cached.second = second;
  }
  return absl::StrFormat("%s.%03dZ", cached.head, static_cast<int>(ms - second * 1000));
}

// What an event is counted under: its field `key` if it is a string, ""
// if it is something else, `absent` without one.
std::string_view CountedField(const Json& e, const char* key, std::string_view absent) {
  if (!e.is_object()) return absent;
  auto f = e.find(key);
  if (f == e.end()) return absent;
  return f->is_string() ? std::string_view(f->get_ref<const std::string&>())
                        : std::string_view();
}

}  // namespace

void EventLog::Emit(const std::string& event, Json fields) {
  // Counted as RecordLocked counts it (a field of the same name wins).
  Outputs outputs;
  if (CountIfNothingTakes(CountedField(fields, "event", event),
                          CountedField(fields, "resource", std::string_view()), &outputs)) {
    return;
  }
  // The event is its fields, which win over the names added here.
  Json e = fields.is_object() ? std::move(fields) : Json::object();
  const absl::Time now = absl::Now();
  e.emplace("ts", EventTimestamp(now));
  e.emplace("source", source_);
  e.emplace("event", event);
  // Its lines are made outside the lock: a large event (a 10,000-device
  // list is 370 KB of JSON) takes milliseconds to format, and every other
  // emitting thread would wait on it.
  const Lines lines = FormatLines(e, now, outputs);
  std::vector<std::shared_ptr<const std::function<void()>>> listeners;
  {
    absl::MutexLock lock(&mu_);
    RecordLocked(std::move(e), lines);
    if (!listeners_.empty()) listeners = listeners_;
  }
  for (const auto& l : listeners) (*l)();
}

EventLog::Lines EventLog::FormatLines(const Json& e, absl::Time now, Outputs outputs) {
  Lines lines;
  if (outputs.file) {
    lines.file = e.dump(-1, ' ', false, Json::error_handler_t::replace);
    lines.file += '\n';
  }
  if (outputs.json_log) {
    // As klog's JSON format writes an info line of verbosity 1
    // (proxy/ops/json_log.h).
    nlohmann::ordered_json j;
    j["ts"] = absl::ToDoubleSeconds(now - absl::UnixEpoch());
    j["msg"] = std::string(CountedField(e, "event", std::string_view()));
    j["v"] = 1;
    for (auto it = e.begin(); it != e.end(); ++it) {
      if (it.key() != "ts") j[it.key()] = it.value();
    }
    lines.json_log = j.dump(-1, ' ', false, Json::error_handler_t::replace);
    lines.json_log += '\n';
  }
  if (outputs.echo) {
    lines.echo = Format(e);
    lines.echo += '\n';
  }
  return lines;
}

void EventLog::AddListener(std::function<void()> listener) {
  absl::MutexLock lock(&mu_);
  listeners_.push_back(std::make_shared<const std::function<void()>>(std::move(listener)));
}

void EventLog::RecordLocked(Json e, const Lines& lines) {
  const std::string_view event = CountedField(e, "event", std::string_view());
  CountLocked(event, CountedField(e, "resource", std::string_view()));
  // An output turned on between the formatting and now starts with the
  // next event; one turned off gets nothing more.
  if (file_ != nullptr && !lines.file.empty()) {
    fwrite(lines.file.data(), 1, lines.file.size(), file_);
    fflush(file_);
  }
  if (json_log_ && !lines.json_log.empty()) {
    fwrite(lines.json_log.data(), 1, lines.json_log.size(), stderr);
  }
  if (echo_ && !lines.echo.empty()) {
    fwrite(lines.echo.data(), 1, lines.echo.size(), stdout);
    fflush(stdout);
  }
  events_.push_back(std::move(e));
  if (events_.size() > history_) {
    events_.pop_front();
    ++dropped_;
  }
}

bool EventLog::CountIfNothingTakes(std::string_view event, std::string_view resource,
                                   Outputs* outputs) {
  absl::MutexLock lock(&mu_);
  if (!NothingTakesLocked()) {
    if (outputs != nullptr) *outputs = Outputs{file_ != nullptr, json_log_, echo_};
    return false;
  }
  CountLocked(event, resource);
  ++dropped_;
  return true;
}

void EventLog::CountLocked(std::string_view event, std::string_view resource) {
  const std::pair<std::string_view, std::string_view> key(event, resource);
  if (auto c = counts_.find(key); c != counts_.end()) {
    ++c->second;
  } else {
    counts_.emplace(std::pair<std::string, std::string>(event, resource), 1);
  }
}

void EventLog::SetJsonLog(bool on) {
  absl::MutexLock lock(&mu_);
  json_log_ = on;
}

void EventLog::SetHistory(size_t n) {
  absl::MutexLock lock(&mu_);
  history_ = n;
  while (events_.size() > history_) {
    events_.pop_front();
    ++dropped_;
  }
}

std::vector<Json> EventLog::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return {events_.begin(), events_.end()};
}

std::map<std::pair<std::string, std::string>, int64_t> EventLog::Counts() const {
  absl::MutexLock lock(&mu_);
  return {counts_.begin(), counts_.end()};
}

size_t EventLog::Size() const {
  absl::MutexLock lock(&mu_);
  return dropped_ + events_.size();
}

std::vector<Json> EventLog::Since(size_t from) const {
  absl::MutexLock lock(&mu_);
  std::vector<Json> out;
  for (size_t i = std::max(from, dropped_); i < dropped_ + events_.size(); ++i) {
    out.push_back(events_[i - dropped_]);
  }
  return out;
}

std::optional<Json> EventLog::WaitFor(const std::function<bool(const Json&)>& pred,
                                      absl::Duration timeout, size_t from) const {
  absl::MutexLock lock(&mu_);
  std::optional<Json> found;
  size_t scanned = from;  // absolute index
  auto check = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    scanned = std::max(scanned, dropped_);
    for (; scanned < dropped_ + events_.size(); ++scanned) {
      const Json& e = events_[scanned - dropped_];
      if (pred(e)) {
        found = e;
        return true;
      }
    }
    return false;
  };
  mu_.AwaitWithTimeout(absl::Condition(&check), timeout);
  return found;
}

std::optional<Json> EventLog::WaitForEvent(const std::string& event, const Json& match,
                                           absl::Duration timeout, size_t from) const {
  return WaitFor(
      [&](const Json& e) { return e.value("event", "") == event && JsonMatches(e, match); },
      timeout, from);
}

std::string EventLog::Format(const Json& e) {
  std::string ts = e.value("ts", "");
  // Keep HH:MM:SS.mmm of the timestamp.
  std::string clock = ts.size() >= 23 ? ts.substr(11, 12) : ts;
  std::string out = absl::StrCat(clock, " ", e.value("source", ""), ": ",
                                 e.value("event", ""));
  for (auto it = e.begin(); it != e.end(); ++it) {
    if (it.key() == "ts" || it.key() == "source" || it.key() == "event") continue;
    std::string v = it.value().is_string() ? it.value().get<std::string>()
                                           : it.value().dump();
    absl::StrAppend(&out, " ", it.key(), "=", v);
  }
  return out;
}

bool JsonMatches(const Json& event, const Json& match) {
  if (!match.is_object()) return true;
  for (auto it = match.begin(); it != match.end(); ++it) {
    auto f = event.find(it.key());
    if (f == event.end() || *f != it.value()) return false;
  }
  return true;
}

}  // namespace dpproxy
