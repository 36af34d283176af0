// File: event_log.h
//
// Structured events as JSON lines: one object per line with "ts" (RFC 3339,
// UTC), "source" and "event", plus event-specific fields. The tools write
// them to a file that tests and CI scripts read, optionally echo a readable
// line to stdout, and keep them in memory so in-process tests can wait for
// one:
//
//   log.Emit("registered", {{"resource", "vendor.com/gpu"}});
//   auto e = log.WaitFor([](const Json& j) { return j["event"] == "registered"; },
//                        absl::Seconds(5));
#ifndef DPPROXY_PROXY_EVENTS_EVENT_LOG_H_
#define DPPROXY_PROXY_EVENTS_EVENT_LOG_H_

#include <cstdio>
#include <deque>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dpproxy {

using Json = nlohmann::json;

class EventLog {
 public:
  // Keeps the last `history` events in memory (every event still goes to
  // the file): a daemon emits one per call and must not grow without bound.
  explicit EventLog(std::string source, size_t history = 10000);
  ~EventLog();

  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // Appends events to `path` from now on (created if missing).
  absl::Status OpenFile(const std::string& path);
  // Keeps only the last `n` events in memory from now on; 0 keeps none.
  // The in-memory history serves WaitFor (tests, tools); a daemon, where
  // nothing reads it, keeps none. An event that nothing takes (no history,
  // file, echo, JSON log or listener) is only counted: no object is made.
  void SetHistory(size_t n);
  // Prints a readable line per event to stdout.
  void SetEcho(bool echo);
  // Writes each event to stderr as a klog JSON info line of verbosity 1 too
  // (`--log_format=json` with -v=1 and up): "ts", "msg" (the event's
  // name), "v" and the event's own fields.
  void SetJsonLog(bool on);

  // Records one event. Thread-safe; never blocks on anything but the file.
  void Emit(const std::string& event, Json fields = Json::object());
  // The same for an event emitted per call: `fields()` (a Json object whose
  // "resource", if any, is `resource`) is made only if something takes the
  // event beyond its count.
  template <typename MakeFields>
  void EmitPerCall(const std::string& event, std::string_view resource,
                   const MakeFields& fields) {
    if (CountIfNothingTakes(event, resource)) return;
    Emit(event, fields());
  }

  // The events still in memory, oldest first.
  std::vector<Json> Snapshot() const;
  // How many events were emitted in all; the index of the next one.
  size_t Size() const;
  // The events still in memory whose index is >= `from`, oldest first.
  std::vector<Json> Since(size_t from) const;

  // Waits until an event at index >= `from` (an index as counted by Size())
  // satisfies `pred`; returns it, or nullopt after `timeout`. Events that
  // left the in-memory history are not searched. `pred` may be called more
  // than once for an event: it must not count calls (use Since for that).
  std::optional<Json> WaitFor(const std::function<bool(const Json&)>& pred,
                              absl::Duration timeout, size_t from = 0) const;

  // Shorthand: the first event named `event` whose fields include all of
  // `match` (equal values).
  std::optional<Json> WaitForEvent(const std::string& event, const Json& match,
                                   absl::Duration timeout, size_t from = 0) const;

  // Calls `listener` after every event from now on, once the event is in
  // memory and outside the log's lock, on the emitting thread; it must be
  // quick and must not emit. For a waiter on several logs at once (tests).
  // Listeners last as long as the log.
  void AddListener(std::function<void()> listener);

  // How many events of each name were emitted, per "resource" field ("" if
  // the event has none): (event, resource) -> count. For metrics.
  std::map<std::pair<std::string, std::string>, int64_t> Counts() const;

  // The readable form of an event, as echoed.
  static std::string Format(const Json& e);

 private:
  // Where an event goes besides memory, and its line for each.
  struct Outputs {
    bool file = false, json_log = false, echo = false;
  };
  struct Lines {
    std::string file, json_log, echo;
  };
  static Lines FormatLines(const Json& e, absl::Time now, Outputs outputs);
  // Counts, writes (`lines`, made by FormatLines), echoes and keeps one
  // event.
  void RecordLocked(Json e, const Lines& lines) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts the event and returns true if nothing takes it beyond its count
  // (no history, file, echo, JSON log or listener); otherwise false, with
  // the outputs it goes to in `*outputs` (if given).
  bool CountIfNothingTakes(std::string_view event, std::string_view resource,
                           Outputs* outputs = nullptr);
  bool NothingTakesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return history_ == 0 && file_ == nullptr && !echo_ && !json_log_ && listeners_.empty();
  }
  // Counts one event of `event` for `resource`.
  void CountLocked(std::string_view event, std::string_view resource)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // (event, resource) pairs, found by views of them: no key is built to
  // count an event already counted.
  struct CountLess {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return std::pair<std::string_view, std::string_view>(a.first, a.second) <
             std::pair<std::string_view, std::string_view>(b.first, b.second);
    }
  };

  const std::string source_;
  mutable absl::Mutex mu_;
  size_t history_ ABSL_GUARDED_BY(mu_);
  std::deque<Json> events_ ABSL_GUARDED_BY(mu_);
  size_t dropped_ ABSL_GUARDED_BY(mu_) = 0;  // index of events_.front()
  std::map<std::pair<std::string, std::string>, int64_t, CountLess> counts_
      ABSL_GUARDED_BY(mu_);
  FILE* file_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool echo_ ABSL_GUARDED_BY(mu_) = false;
  bool json_log_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<const std::function<void()>>> listeners_ ABSL_GUARDED_BY(mu_);
};

// True if every key of `match` is in `event` with an equal value.
bool JsonMatches(const Json& event, const Json& match);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_EVENTS_EVENT_LOG_H_
