// File: json_log.h
//
// `--log_format=json`: every log line as one JSON object on stderr, the way
// klog's JSON format writes them, for log pipelines that parse rather than
// scrape:
//
//   {"ts":"2026-11-22T17:59:01.123Z","level":"warning","caller":"resource.cc:367",
//    "msg":"resource vendor.com/gpu: backend ... lost"}
//
// Lifecycle events (EventLog) are written the same way, their fields as
// keys of their own (resource, kubelet_api, backend_api, socket, ...):
//
//   {"ts":"...","level":"info","msg":"kubelet_registered","event":"kubelet_registered",
//    "resource":"vendor.com/gpu","kubelet_api":"v1beta1",...}
#ifndef DPPROXY_PROXY_OPS_JSON_LOG_H_
#define DPPROXY_PROXY_OPS_JSON_LOG_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dpproxy {

// One glog message as a JSON line (no newline). `severity` is glog's
// (0 INFO ... 3 FATAL).
std::string JsonLogLine(int severity, absl::string_view file, int line, absl::Time time,
                        absl::string_view message);

// From now on glog writes JSON lines to stderr and nothing else (no text,
// no log files). Call once, after InitGoogleLogging.
void UseJsonLogs();

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_OPS_JSON_LOG_H_
