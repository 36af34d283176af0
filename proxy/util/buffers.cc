#include "proxy/util/buffers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace dpproxy {

void ReserveMapped(std::string* s, size_t capacity) {
  s->reserve(capacity);
  if (s->capacity() < kMapAtOnceBytes) return;
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  // The whole pages inside the buffer: a page it shares with other
  // allocations is mapped already.
  uintptr_t begin = reinterpret_cast<uintptr_t>(s->data()) + s->size();
  uintptr_t end = reinterpret_cast<uintptr_t>(s->data()) + s->capacity();
  begin = (begin + page - 1) & ~(page - 1);
  end &= ~(page - 1);
  if (end <= begin) return;
  // Best effort: EINVAL on an older kernel, ENOMEM or EFAULT under memory
  // pressure; the writes then fault the pages in as usual.
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
}

}  // namespace dpproxy
