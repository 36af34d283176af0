// File: cordon_book.h
//
// The devices an operator took out of service by hand (`dpctl cordon`),
// kept in <state_dir>/cordons.json until they are put back: each cordon
// is on disk (written, fsynced and renamed into place) before the caller
// hears it was taken, so it survives dpproxy's restarts, crashes and
// takeovers (which share the state directory).
//
// A device is named as the kubelet sees it: the resource name and the
// device ID dpproxy shows the kubelet. Thread-safe.
#ifndef DPPROXY_PROXY_STATE_CORDON_BOOK_H_
#define DPPROXY_PROXY_STATE_CORDON_BOOK_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dpproxy {

struct Cordon {
  std::string resource;
  std::string device;
  std::string reason;
  absl::Time since;
  // Who asked: the caller's uid and pid (in dpproxy's PID namespace; 0 if
  // it cannot see the caller).
  uid_t by_uid = 0;
  int64_t by_pid = 0;
};

class CordonBook {
 public:
  // The file's name in the state directory.
  static constexpr char kFileName[] = "cordons.json";

  // Reads `path` (none there: no cordons). A file that cannot be read or
  // parsed is an error naming it and what is wrong: a cordon must never be
  // lost silently, so the caller refuses to start rather than hand the
  // device out.
  static absl::StatusOr<std::unique_ptr<CordonBook>> Open(const std::string& path);

  // Reads the file again (another dpproxy wrote it during a takeover that
  // was given back). On an error the book is unchanged.
  absl::Status Reload();

  // Takes `c` out of service (a cordon already there has its reason, time
  // and caller replaced). Returns once it is on disk; on a write error
  // nothing changes.
  absl::Status Set(const Cordon& c);
  // Puts the device back: the cordon removed, on disk. kNotFound naming
  // the device if it was not cordoned.
  absl::StatusOr<Cordon> Remove(const std::string& resource, const std::string& device);

  std::vector<Cordon> List();
  // resource -> device -> reason.
  std::map<std::string, std::map<std::string, std::string>> ByResource();
  // Grows with each change.
  uint64_t version() const { return version_.load(); }
  const std::string& path() const { return path_; }

 private:
  explicit CordonBook(std::string path) : path_(std::move(path)) {}
  using Key = std::pair<std::string, std::string>;  // resource, device
  // `cordons` on disk (atomically).
  absl::Status WriteLocked(const std::map<Key, Cordon>& cordons) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  std::map<Key, Cordon> cordons_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> version_{1};
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_CORDON_BOOK_H_
