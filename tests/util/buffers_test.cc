// ReserveMapped: room reserved, contents kept, and a large buffer's pages
// resident before anything is written to them.
#include "proxy/util/buffers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace dpproxy {
namespace {

// Whether this kernel maps pages on request (Linux 5.14 and later).
bool KernelPopulates() {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  const bool ok = ::madvise(p, page, MADV_POPULATE_WRITE) == 0;
  ::munmap(p, page);
  return ok;
}

// How many of the whole pages in [begin, end) are resident.
size_t ResidentPages(const char* begin, const char* end, size_t* pages) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = (reinterpret_cast<uintptr_t>(begin) + page - 1) & ~(page - 1);
  const uintptr_t e = reinterpret_cast<uintptr_t>(end) & ~(page - 1);
  *pages = e > b ? (e - b) / page : 0;
  if (*pages == 0) return 0;
  std::vector<unsigned char> in(*pages);
  if (::mincore(reinterpret_cast<void*>(b), e - b, in.data()) != 0) {
    ADD_FAILURE() << "mincore: errno " << errno;
    return 0;
  }
  size_t resident = 0;
  for (unsigned char c : in) resident += c & 1;
  return resident;
}

TEST(BuffersTest, ReservesRoomAndKeepsTheContents) {
  std::string s = "journal";
  ReserveMapped(&s, 3 << 20);
  EXPECT_EQ(s, "journal");
  EXPECT_GE(s.capacity(), size_t{3 << 20});

  std::string small = "x";
  ReserveMapped(&small, 100);
  EXPECT_EQ(small, "x");
  EXPECT_GE(small.capacity(), size_t{100});
}

TEST(BuffersTest, ALargeBuffersPagesAreResidentBeforeTheyAreWritten) {
  std::string s;
  ReserveMapped(&s, 8 << 20);
  size_t pages = 0;
  const size_t resident = ResidentPages(s.data(), s.data() + s.capacity(), &pages);
  ASSERT_GT(pages, size_t{1000});
  if (KernelPopulates()) {
    EXPECT_EQ(resident, pages);
  } else {
    // An older kernel: the buffer is still reserved, its pages fault in
    // as they are written.
    EXPECT_GE(s.capacity(), size_t{8 << 20});
  }
  s.append(8 << 20, 'z');
  EXPECT_EQ(s.size(), size_t{8 << 20});
  EXPECT_EQ(s.back(), 'z');
}

}  // namespace
}  // namespace dpproxy
