// Large buffers written whole, without a page fault per page.
#ifndef DPPROXY_PROXY_UTIL_BUFFERS_H_
#define DPPROXY_PROXY_UTIL_BUFFERS_H_

#include <cstddef>
#include <string>

namespace dpproxy {

// Buffers at least this large get their pages mapped at once.
inline constexpr size_t kMapAtOnceBytes = 64 * 1024;

// Reserves room for `capacity` bytes in `*s` (its contents unchanged) and,
// for a large buffer, has the kernel map the pages of that room in one
// call (madvise MADV_POPULATE_WRITE) instead of taking a page fault for
// each page as it is first written. dpproxy's large buffers are fresh
// mappings (its malloc maps anything over 128 KiB, and gives it back when
// it is freed), and a page fault costs several microseconds, more on a
// virtual machine whose page tables the hypervisor keeps: a 2.4 MB
// snapshot laid out page by page cost about twice the time of the same
// laid out in room mapped at once. A kernel without the call (before
// Linux 5.14) falls back to faults.
void ReserveMapped(std::string* s, size_t capacity);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_BUFFERS_H_
