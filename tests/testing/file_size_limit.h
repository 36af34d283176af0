// File: file_size_limit.h
//
// A full disk, as the kernel reports it: while a FileSizeLimit lives, every
// write past `bytes` in any file of this process fails with EFBIG
// (RLIMIT_FSIZE, SIGXFSZ ignored).
#ifndef DPPROXY_TESTS_TESTING_FILE_SIZE_LIMIT_H_
#define DPPROXY_TESTS_TESTING_FILE_SIZE_LIMIT_H_

#include <signal.h>
#include <sys/resource.h>

namespace dpproxy::testing {

class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &old_);
    struct rlimit lim = old_;
    lim.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() { setrlimit(RLIMIT_FSIZE, &old_); }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  struct rlimit old_;
};

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_FILE_SIZE_LIMIT_H_
