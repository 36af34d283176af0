// ApiServerSim's watch of ResourceSlices (apiserver_sim.h), as client-go's
// reflector uses it: a JSON stream of {"type", "object"} events.
#include <httplib.h>

#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tools/apiserver_sim/apiserver_sim.h"
#include "tools/apiserver_sim/apiserver_sim_reply.h"

namespace dpproxy::sim {
namespace {

// Changes kept for watchers that resume from a resourceVersion; one older
// than these is answered 410 Gone, and the reflector lists again.
constexpr size_t kSliceEventsKept = 4096;
// A watch without timeoutSeconds ends after this, as the API server's do
// (it picks 30 to 60 minutes).
constexpr absl::Duration kDefaultWatchTimeout = absl::Minutes(30);

std::string Event(const std::string& type, const nlohmann::json& object) {
  return nlohmann::json{{"type", type}, {"object", object}}.dump() + "\n";
}

}  // namespace

void ApiServerSim::NoteSlice(const std::string& type, const Json& slice) {
  Json object = slice;
  if (type == "DELETED") object["metadata"]["resourceVersion"] = absl::StrCat(++resource_version_);
  slice_events_.push_back({resource_version_, type, std::move(object)});
  while (slice_events_.size() > kSliceEventsKept) slice_events_.pop_front();
}

void ApiServerSim::ServeSliceWatch(const httplib::Request& req, httplib::Response& res,
                                   const std::string& api_version) {
  struct Stream {
    std::map<std::string, std::string> selector;
    int64_t after = 0;    // events sent up to this resourceVersion
    std::string pending;  // initial events, sent first
    absl::Time deadline;
  };
  auto st = std::make_shared<Stream>();
  st->selector = ParseFieldSelector(req.get_param_value("fieldSelector"));
  int64_t timeout_s = 0;
  st->deadline = absl::Now() + (absl::SimpleAtoi(req.get_param_value("timeoutSeconds"), &timeout_s) &&
                                        timeout_s > 0
                                    ? absl::Seconds(timeout_s)
                                    : kDefaultWatchTimeout);
  const std::string from = req.get_param_value("resourceVersion");
  const bool initial = req.get_param_value("sendInitialEvents") == "true";
  {
    absl::MutexLock lock(&mu_);
    int64_t rv = 0;
    if (initial || from.empty() || from == "0") {
      // The current slices as ADDED; with sendInitialEvents a BOOKMARK
      // marks where they end.
      for (const auto& [name, s] : slices_) {
        if (SliceMatches(s, st->selector)) st->pending += Event("ADDED", s);
      }
      st->after = resource_version_;
      if (initial) {
        st->pending += Event(
            "BOOKMARK",
            {{"kind", "ResourceSlice"},
             {"apiVersion", api_version},
             {"metadata",
              {{"resourceVersion", absl::StrCat(resource_version_)},
               {"annotations", {{"k8s.io/initial-events-end", "true"}}}}}});
      }
    } else if (!absl::SimpleAtoi(from, &rv)) {
      return Fail(res, 400, "BadRequest",
                  absl::StrCat("resourceVersion: Invalid value: \"", from, "\""));
    } else if (rv > resource_version_) {
      return Fail(res, 504, "Timeout",
                  absl::StrCat("Too large resource version: ", rv,
                               ", current: ", resource_version_));
    } else if (!slice_events_.empty() && rv < slice_events_.front().rv - 1) {
      return Fail(res, 410, "Expired",
                  absl::StrCat("too old resource version: ", rv, " (",
                               slice_events_.front().rv - 1, ")"));
    } else {
      st->after = rv;
    }
  }
  res.status = 200;
  // The real server answers a JSON watch "application/json", unzipped.
  // httplib gzips that type for a client that accepts gzip (Go's does), and
  // its compressor holds events back until the stream ends; client-go
  // reads the media type's parameters apart, so this type is the same JSON
  // stream to it, sent as each event comes.
  res.set_chunked_content_provider("application/json;stream=watch", [this, st](
                                                                        size_t,
                                                                        httplib::DataSink& sink) {
    std::string out = std::move(st->pending);
    st->pending.clear();
    bool end = false;
    {
      absl::MutexLock lock(&mu_);
      auto news = [this, st]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || (!slice_events_.empty() && slice_events_.back().rv > st->after);
      };
      if (out.empty()) {
        // Wakes at least once a second to see whether the client is gone.
        mu_.AwaitWithTimeout(absl::Condition(&news), absl::Seconds(1));
      }
      for (const SliceEvent& e : slice_events_) {
        if (e.rv <= st->after) continue;
        if (SliceMatches(e.object, st->selector)) out += Event(e.type, e.object);
        st->after = e.rv;
      }
      end = stopping_ || absl::Now() >= st->deadline;
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) return false;
    if (end) {
      sink.done();
    } else if (!sink.is_writable()) {
      return false;  // the client went away
    }
    return true;
  });
}

}  // namespace dpproxy::sim
