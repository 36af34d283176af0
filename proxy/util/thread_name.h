// Names the calling thread as `top -H`, `ps -L` and debuggers show it
// (/proc/PID/task/TID/comm): at most 15 characters, the rest cut off.
// dpproxy's own threads are named "dpp-<what>", so a busy or stuck one is
// told from gRPC's at a glance.
#ifndef DPPROXY_PROXY_UTIL_THREAD_NAME_H_
#define DPPROXY_PROXY_UTIL_THREAD_NAME_H_

#include <pthread.h>

#include <string>

namespace dpproxy {

inline void NameThisThread(const std::string& name) {
  (void)::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_THREAD_NAME_H_
