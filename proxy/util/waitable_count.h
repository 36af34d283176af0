// File: waitable_count.h
//
// A count one thread raises and others can wait on: how many passes a
// loop has made, say. Waiting is on the count's own condition, with a
// deadline, never by polling.
//
//   WaitableCount passes;
//   passes.Add();                                    // the loop, each pass
//   passes.WaitFor(passes.Get() + 2, absl::Seconds(5));  // two more passes
#ifndef DPPROXY_PROXY_UTIL_WAITABLE_COUNT_H_
#define DPPROXY_PROXY_UTIL_WAITABLE_COUNT_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dpproxy {

class WaitableCount {
 public:
  void Add() {
    absl::MutexLock lock(&mu_);
    ++n_;
  }
  int64_t Get() const {
    absl::MutexLock lock(&mu_);
    return n_;
  }
  // True once the count is at least `n`; false if it is not by `timeout`.
  bool WaitFor(int64_t n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return n_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

 private:
  mutable absl::Mutex mu_;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_WAITABLE_COUNT_H_
