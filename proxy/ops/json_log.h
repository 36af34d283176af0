// File: json_log.h
//
// dpproxy's log lines in klog's two formats, so that parsers written for
// the kubelet's logs read dpproxy's too.
//
// `--log_format=text` (the default): klog's header, then the message:
//
//   W1122 17:59:01.123456   12345 resource.cc:367] resource vendor.com/gpu: ...
//
// severity letter, month and day, time with microseconds, thread ID (7
// wide), file:line. Control characters in the message are escaped (\n,
// \r, \xNN): every message is one line, whatever names it quotes.
//
// `--log_format=json`: klog's JSON format, one object per line:
//
//   {"ts":1764259141.123456,"caller":"resource.cc:367","msg":"...","v":0}
//
// "ts" is seconds since the Unix epoch; an info line has "v" (its
// verbosity, 0); an error has "err" (the message) instead, as klog's
// ErrorS does; a warning or error also says "level". At the default
// verbosity that is one line per happening. With -v=1 and up, lifecycle
// events (EventLog) come too, as info lines of verbosity 1 whose "msg" is
// the event's name, with the event's fields as keys of their own
// (resource, kubelet_api, ...).
#ifndef DPPROXY_PROXY_OPS_JSON_LOG_H_
#define DPPROXY_PROXY_OPS_JSON_LOG_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dpproxy {

// One glog message as a klog JSON line (no newline). `severity` is glog's
// (0 INFO ... 3 FATAL).
std::string JsonLogLine(int severity, absl::string_view file, int line, absl::Time time,
                        absl::string_view message);
// The same as a klog text line (no newline); `thread` is the logging
// thread's ID.
std::string TextLogLine(int severity, absl::string_view file, int line, absl::Time time,
                        int thread, absl::string_view message);

// From now on glog writes klog JSON lines (UseJsonLogs) or klog text lines
// (UseTextLogs) to stderr, and nothing else (no glog header, no log
// files). Call one, once, after InitGoogleLogging.
void UseJsonLogs();
void UseTextLogs();

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_OPS_JSON_LOG_H_
