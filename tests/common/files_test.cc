#include "proxy/common/files.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/common/dir_watcher.h"
#include "proxy/common/event_log.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(FilesTest, SocketPathLimit) {
  EXPECT_TRUE(ValidateSocketPath(std::string(107, 'a')).ok());
  absl::Status s = ValidateSocketPath("/" + std::string(107, 'a'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("108 bytes"));
  EXPECT_FALSE(ValidateSocketPath("").ok());
}

TEST(FilesTest, JoinPath) {
  EXPECT_EQ(JoinPath("/a/", "b"), "/a/b");
  EXPECT_EQ(JoinPath("/a", "/b"), "/a/b");
  EXPECT_EQ(JoinPath("/", "b"), "/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
}

TEST(FilesTest, WriteFileAtomicReplacesAndLeavesNoTemp) {
  testing::ShortTempDir dir;
  const std::string path = dir.Sub("state.json");
  ASSERT_TRUE(WriteFileAtomic(path, "one").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "two").ok());
  EXPECT_EQ(*ReadFile(path), "two");
  EXPECT_FALSE(PathExists(path + ".tmp"));
}

TEST(FilesTest, WriteFileAtomicFailureKeepsOldFile) {
  if (::geteuid() == 0) {
    // Root ignores directory permissions; make the rename fail instead by
    // putting a directory where the target file should be replaced.
    testing::ShortTempDir dir;
    const std::string path = dir.Sub("d");
    ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((path + "/x").c_str(), 0755), 0);
    absl::Status s = WriteFileAtomic(path, "new");
    EXPECT_FALSE(s.ok());
    EXPECT_FALSE(PathExists(path + ".tmp"));
    EXPECT_TRUE(PathExists(path + "/x"));  // old content intact
    return;
  }
  testing::ShortTempDir dir;
  const std::string path = dir.Sub("state.json");
  ASSERT_TRUE(WriteFileAtomic(path, "old").ok());
  ASSERT_EQ(::chmod(dir.path().c_str(), 0555), 0);
  EXPECT_FALSE(WriteFileAtomic(path, "new").ok());
  ::chmod(dir.path().c_str(), 0755);
  EXPECT_EQ(*ReadFile(path), "old");
}

TEST(FilesTest, ReadMissingFileIsNotFound) {
  EXPECT_EQ(ReadFile("/nonexistent/dpp/file").status().code(), absl::StatusCode::kNotFound);
}

TEST(FilesTest, RemoveFilesExceptKeepsDirectoriesAndNamedFiles) {
  testing::ShortTempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("kubelet_internal_checkpoint"), "{}").ok());
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("a.sock"), "").ok());
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("DEPRECATION"), "").ok());
  ASSERT_TRUE(MakeDirs(dir.Sub("subdir")).ok());
  absl::StatusOr<std::vector<std::string>> removed =
      RemoveFilesExcept(dir.path(), {"kubelet_internal_checkpoint"});
  ASSERT_TRUE(removed.ok());
  EXPECT_THAT(*removed, ElementsAre("DEPRECATION", "a.sock"));
  EXPECT_TRUE(PathExists(dir.Sub("kubelet_internal_checkpoint")));
  EXPECT_TRUE(PathExists(dir.Sub("subdir")));
}

TEST(FilesTest, FileIdChangesWhenFileIsRecreated) {
  testing::ShortTempDir dir;
  const std::string path = dir.Sub("kubelet.sock");
  ASSERT_TRUE(WriteFileAtomic(path, "").ok());
  std::optional<FileId> a = StatFileId(path);
  ASSERT_TRUE(a.has_value());
  absl::SleepFor(absl::Milliseconds(20));  // coarse kernel timestamps
  ::unlink(path.c_str());
  ASSERT_TRUE(WriteFileAtomic(path, "").ok());
  std::optional<FileId> b = StatFileId(path);
  ASSERT_TRUE(b.has_value());
  EXPECT_NE(*a, *b);
  EXPECT_FALSE(StatFileId(dir.Sub("missing")).has_value());
}

TEST(DirWatcherTest, ReportsCreateAndDeleteAndTicks) {
  testing::ShortTempDir dir;
  std::mutex mu;
  std::vector<std::string> seen;
  std::atomic<int> ticks{0};
  DirWatcher w(dir.path(), [&](const DirWatcher::Event& e) {
    if (e.kind == DirWatcher::Event::kTick) {
      ++ticks;
      return;
    }
    std::lock_guard<std::mutex> l(mu);
    seen.push_back((e.kind == DirWatcher::Event::kCreated ? "+" : "-") + e.name);
  });
  ASSERT_TRUE(w.Start().ok());
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("x"), "").ok());  // creates x.tmp, renames to x
  ::unlink(dir.Sub("x").c_str());
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (;;) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (std::find(seen.begin(), seen.end(), "-x") != seen.end()) break;
    }
    ASSERT_LT(absl::Now(), deadline) << "no delete event";
    absl::SleepFor(absl::Milliseconds(10));
  }
  {
    std::lock_guard<std::mutex> l(mu);
    EXPECT_NE(std::find(seen.begin(), seen.end(), "+x"), seen.end());
  }
  EXPECT_GE(ticks.load(), 1);  // the first tick comes at once
  w.Stop();
  w.Stop();  // idempotent
}

TEST(EventLogTest, WritesJsonLinesAndWaits) {
  testing::ShortTempDir dir;
  EventLog log("test");
  ASSERT_TRUE(log.OpenFile(dir.Sub("events.jsonl")).ok());
  log.Emit("hello", {{"resource", "vendor.com/gpu"}, {"n", 2}});
  std::optional<Json> e = log.WaitForEvent("hello", {{"n", 2}}, absl::Seconds(1));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ((*e)["source"], "test");
  EXPECT_FALSE(log.WaitForEvent("hello", {{"n", 3}}, absl::Milliseconds(10)).has_value());
  std::string text = *ReadFile(dir.Sub("events.jsonl"));
  Json parsed = Json::parse(text);  // one line, one object
  EXPECT_EQ(parsed["event"], "hello");
  EXPECT_EQ(parsed["resource"], "vendor.com/gpu");
  EXPECT_THAT(EventLog::Format(parsed), HasSubstr("test: hello n=2 resource=vendor.com/gpu"));
  EXPECT_FALSE(log.OpenFile("/nonexistent-dir/x.jsonl").ok());
}

TEST(EventLogTest, HistoryIsBoundedButIndicesStayAbsolute) {
  testing::ShortTempDir dir;
  EventLog log("test", /*history=*/3);
  ASSERT_TRUE(log.OpenFile(dir.Sub("events.jsonl")).ok());
  for (int i = 0; i < 5; ++i) log.Emit("e", {{"n", i}});
  EXPECT_EQ(log.Size(), 5u);
  ASSERT_EQ(log.Snapshot().size(), 3u);
  EXPECT_EQ(log.Snapshot().front()["n"], 2);
  EXPECT_FALSE(log.WaitForEvent("e", {{"n", 0}}, absl::ZeroDuration()).has_value());  // gone
  EXPECT_TRUE(log.WaitForEvent("e", {{"n", 4}}, absl::ZeroDuration(), 4).has_value());
  EXPECT_FALSE(log.WaitForEvent("e", {{"n", 3}}, absl::ZeroDuration(), 4).has_value());
  std::string text = *ReadFile(dir.Sub("events.jsonl"));  // the file keeps all
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 5);
  EXPECT_EQ(log.Counts().at({"e", ""}), 5);
}

}  // namespace
}  // namespace dpproxy
