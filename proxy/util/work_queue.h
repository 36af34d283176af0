// File: work_queue.h
//
// A fixed pool of threads running queued jobs in order of submission: the
// registrar hands blocking work (Register calls that may wait 10 s on a
// kubelet's dial, static-backend connects) to it, so detection, serving and
// timers never wait behind one resource's registration, and the thread count
// does not grow with the number of resources.
//
//   WorkQueue q(4);
//   q.Submit([] { SlowCall(); });
//   q.Shutdown();  // runs nothing more; waits for running jobs
#ifndef DPPROXY_PROXY_UTIL_WORK_QUEUE_H_
#define DPPROXY_PROXY_UTIL_WORK_QUEUE_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proxy/util/thread_name.h"

namespace dpproxy {

class WorkQueue {
 public:
  explicit WorkQueue(int threads) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this] {
        NameThisThread("dpp-worker");
        Run();
      });
    }
  }
  ~WorkQueue() { Shutdown(); }

  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // False (and `job` dropped) once shutting down.
  bool Submit(std::function<void()> job) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
    jobs_.push_back(std::move(job));
    return true;
  }

  // Drops queued jobs, waits for running ones. Idempotent.
  void Shutdown() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      jobs_.clear();
    }
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> job;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !jobs_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (stopping_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_WORK_QUEUE_H_
