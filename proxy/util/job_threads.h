// Jobs that may block for a long time (a wait for a backend, a handoff
// step), each on a thread of its own, so that none runs on gRPC's threads.
// A finished job's thread is joined by the next Spawn, so a caller that
// starts job after job leaves no ended thread (and its mapped stack)
// behind; JoinAll, or the destructor, waits for the rest.
//
//   JobThreads jobs;
//   jobs.Spawn([reactor] { reactor->Finish(SlowWork()); });
#ifndef DPPROXY_PROXY_UTIL_JOB_THREADS_H_
#define DPPROXY_PROXY_UTIL_JOB_THREADS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dpproxy {

class JobThreads {
 public:
  JobThreads() = default;
  ~JobThreads() { JoinAll(); }
  JobThreads(const JobThreads&) = delete;
  JobThreads& operator=(const JobThreads&) = delete;

  void Spawn(std::function<void()> job) ABSL_LOCKS_EXCLUDED(mu_) {
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::vector<std::thread> finished;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = threads_.begin(); it != threads_.end();) {
        if (!it->done->load()) {
          ++it;
          continue;
        }
        finished.push_back(std::move(it->thread));
        it = threads_.erase(it);
      }
      threads_.push_back({std::thread([job = std::move(job), done] {
                            job();
                            done->store(true);
                          }),
                          done});
    }
    for (std::thread& t : finished) t.join();
  }

  // Waits for every job spawned so far. A job that calls it (directly or
  // through what it stops) leaves its own thread to end after it.
  void JoinAll() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<Job> all;
    {
      absl::MutexLock lock(&mu_);
      all.swap(threads_);
    }
    for (Job& j : all) {
      if (j.thread.get_id() == std::this_thread::get_id()) {
        j.thread.detach();
      } else {
        j.thread.join();
      }
    }
  }

 private:
  struct Job {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  absl::Mutex mu_;
  std::vector<Job> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_JOB_THREADS_H_
