// The cordon book over real files: what is set or removed is on disk when
// the call returns and read back by a new book; a file it cannot read is
// refused naming it, never taken for "no cordons".
#include "proxy/state/cordon_book.h"

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/file_size_limit.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;

class CordonBookTest : public ::testing::Test {
 protected:
  std::unique_ptr<CordonBook> Open() {
    absl::StatusOr<std::unique_ptr<CordonBook>> book = CordonBook::Open(path_);
    EXPECT_TRUE(book.ok()) << book.status();
    return book.ok() ? *std::move(book) : nullptr;
  }
  Cordon Gpu0(const std::string& reason) {
    return Cordon{"vendor.com/gpu", "gpu-0", reason, absl::FromUnixSeconds(1700000000), 1000, 42};
  }

  testing::ShortTempDir tmp_;
  const std::string path_ = tmp_.Sub(CordonBook::kFileName);
};

TEST_F(CordonBookTest, ACordonIsOnDiskWhenSetReturnsAndGoneWhenRemoved) {
  auto book = Open();
  ASSERT_NE(book, nullptr);
  EXPECT_TRUE(book->List().empty());
  const uint64_t v = book->version();
  ASSERT_TRUE(book->Set(Gpu0("ECC errors")).ok());
  EXPECT_GT(book->version(), v);

  auto again = Open();  // as after a restart
  ASSERT_NE(again, nullptr);
  ASSERT_EQ(again->List().size(), 1u);
  const Cordon c = again->List()[0];
  EXPECT_EQ(c.resource, "vendor.com/gpu");
  EXPECT_EQ(c.device, "gpu-0");
  EXPECT_EQ(c.reason, "ECC errors");
  EXPECT_EQ(c.since, absl::FromUnixSeconds(1700000000));
  EXPECT_EQ(c.by_uid, 1000u);
  EXPECT_EQ(c.by_pid, 42);
  EXPECT_EQ(again->ByResource()["vendor.com/gpu"]["gpu-0"], "ECC errors");

  // Cordoned again: the reason replaced, still one.
  ASSERT_TRUE(again->Set(Gpu0("fan failure")).ok());
  ASSERT_EQ(Open()->List().size(), 1u);
  EXPECT_EQ(Open()->List()[0].reason, "fan failure");

  absl::StatusOr<Cordon> removed = again->Remove("vendor.com/gpu", "gpu-0");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->reason, "fan failure");
  EXPECT_TRUE(Open()->List().empty());
  absl::StatusOr<Cordon> twice = again->Remove("vendor.com/gpu", "gpu-0");
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(twice.status().message()),
              HasSubstr("device gpu-0 of vendor.com/gpu is not cordoned"));
}

TEST_F(CordonBookTest, AFileItCannotReadIsRefusedNamingIt) {
  for (const char* text : {"{not json", "[]", "{\"format\": 7, \"cordons\": []}",
                           "{\"format\": 1, \"cordons\": [{\"device\": \"gpu-0\"}]}",
                           "{\"format\": 1, \"cordons\": [{\"resource\": \"r\", \"device\": "
                           "\"d\", \"reason\": 5}]}"}) {
    ASSERT_TRUE(WriteFileAtomic(path_, text).ok());
    absl::StatusOr<std::unique_ptr<CordonBook>> book = CordonBook::Open(path_);
    ASSERT_FALSE(book.ok()) << text;
    EXPECT_EQ(book.status().code(), absl::StatusCode::kFailedPrecondition) << text;
    EXPECT_THAT(std::string(book.status().message()), HasSubstr(path_)) << text;
    EXPECT_THAT(std::string(book.status().message()), HasSubstr("remove it")) << text;
  }
}

TEST_F(CordonBookTest, AFailedWriteChangesNothing) {
  auto book = Open();
  ASSERT_NE(book, nullptr);
  ASSERT_TRUE(book->Set(Gpu0("ECC errors")).ok());
  // A full disk: the write fails, and the book and the file still hold
  // what they held.
  Cordon other = Gpu0("x");
  other.device = "gpu-1";
  absl::Status s;
  {
    testing::FileSizeLimit full(16);
    s = book->Set(other);
  }
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot write the cordons to"));
  EXPECT_EQ(book->List().size(), 1u);
  EXPECT_EQ(Open()->List().size(), 1u);
}

}  // namespace
}  // namespace dpproxy
