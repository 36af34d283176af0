#include "proxy/util/files.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/child_process.h"
#include "proxy/util/dir_watcher.h"
#include "proxy/events/event_log.h"
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

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FilesTest, WriteFileAtomicReplacesAndLeavesNoTemp) {
  testing::ShortTempDir dir;
  const std::string path = dir.Sub("state.json");
  ASSERT_TRUE(WriteFileAtomic(path, "one").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "two").ok());
  EXPECT_EQ(*ReadFile(path), "two");
  EXPECT_THAT(Entries(dir.path()), ElementsAre("state.json"));
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
    EXPECT_THAT(Entries(dir.path()), ElementsAre("d"));  // no temporary left
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

TEST(FilesTest, ReadFileTailReadsOnlyTheEnd) {
  testing::ShortTempDir dir;
  const std::string path = dir.Sub("log");
  std::string text;
  for (int i = 0; i < 10000; ++i) absl::StrAppend(&text, "line ", i, "\n");
  ASSERT_TRUE(WriteFileAtomic(path, text).ok());
  absl::StatusOr<std::string> tail = ReadFileTail(path, 20);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(*tail, text.substr(text.size() - 20));
  EXPECT_EQ(*ReadFileTail(path, text.size() + 100), text);  // shorter: all of it
  EXPECT_EQ(ReadFileTail(dir.Sub("missing"), 20).status().code(), absl::StatusCode::kNotFound);
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
  // A link to a directory is a file here: removed, never followed.
  testing::ShortTempDir elsewhere;
  ASSERT_TRUE(WriteFileAtomic(elsewhere.Sub("theirs"), "x").ok());
  ASSERT_EQ(::symlink(elsewhere.path().c_str(), dir.Sub("link").c_str()), 0);
  removed = RemoveFilesExcept(dir.path(), {"kubelet_internal_checkpoint"});
  ASSERT_TRUE(removed.ok());
  EXPECT_THAT(*removed, ElementsAre("link"));
  EXPECT_TRUE(PathExists(elsewhere.Sub("theirs")));
  EXPECT_EQ(RemoveFilesExcept(dir.Sub("absent"), {}).status().code(),
            absl::StatusCode::kNotFound);
}

// Creates a real Unix socket file at `path` (bound, then closed).
void MakeSocketFile(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
}

// Kubelets 1.33+ (and 1.31.0) remove only sockets, seen through links.
TEST(FilesTest, RemoveFilesExceptSocketsOnlyKeepsEverythingButSockets) {
  testing::ShortTempDir dir;
  testing::ShortTempDir elsewhere;
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("kubelet_internal_checkpoint"), "{}").ok());
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("regular.sock"), "").ok());
  ASSERT_TRUE(MakeDirs(dir.Sub("subdir")).ok());
  MakeSocketFile(dir.Sub("a.sock"));
  MakeSocketFile(dir.Sub("kept.sock"));
  MakeSocketFile(elsewhere.Sub("theirs.sock"));
  ASSERT_TRUE(WriteFileAtomic(elsewhere.Sub("theirs"), "x").ok());
  ASSERT_EQ(::symlink(elsewhere.Sub("theirs.sock").c_str(), dir.Sub("to-socket").c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere.Sub("theirs").c_str(), dir.Sub("to-file").c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere.path().c_str(), dir.Sub("to-dir").c_str()), 0);
  ASSERT_EQ(::symlink(dir.Sub("nothing").c_str(), dir.Sub("dangling").c_str()), 0);
  absl::StatusOr<std::vector<std::string>> removed =
      RemoveFilesExcept(dir.path(), {"kubelet_internal_checkpoint", "kept.sock"},
                        Wipe::kSocketsOnly);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre("a.sock", "to-socket"));
  for (const char* name : {"kubelet_internal_checkpoint", "kept.sock", "regular.sock", "subdir",
                           "to-file", "to-dir"}) {
    EXPECT_TRUE(PathExists(dir.Sub(name))) << name;
  }
  struct stat st;
  EXPECT_EQ(::lstat(dir.Sub("dangling").c_str(), &st), 0);
  EXPECT_TRUE(PathExists(elsewhere.Sub("theirs.sock")));  // the link went, not its target
}

TEST(FilesTest, LockFileIsExclusiveNamesItsHolderAndIsFreedOnClose) {
  testing::ShortTempDir dir;
  absl::StatusOr<int> first = LockFile(dir.Sub("lock"), absl::ZeroDuration());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*ReadFile(dir.Sub("lock")), absl::StrCat(::getpid(), "\n"));
  // A second open file description conflicts even within one process.
  absl::StatusOr<int> second = LockFile(dir.Sub("lock"), absl::Milliseconds(100));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);  // held, not broken
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr(absl::StrCat("is locked by another process (pid ", ::getpid(), ")")));
  ::close(*first);
  second = LockFile(dir.Sub("lock"), absl::ZeroDuration());
  ASSERT_TRUE(second.ok()) << second.status();
  ::close(*second);
  EXPECT_EQ(LockFile(dir.Sub("missing/lock"), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(FilesTest, SocketAcceptsOnlyWhileAServerListens) {
  testing::ShortTempDir dir;
  const std::string path = dir.Sub("s.sock");
  EXPECT_FALSE(SocketAccepts(path));  // missing
  MakeSocketFile(path);
  EXPECT_FALSE(SocketAccepts(path));  // bound once, nobody listening
  ASSERT_EQ(::unlink(path.c_str()), 0);
  {
    testing::SilentSocket listening(path);
    ASSERT_GE(listening.fd(), 0);
    EXPECT_TRUE(SocketAccepts(path));
  }
  EXPECT_FALSE(SocketAccepts(path));
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("plain"), "x").ok());
  EXPECT_FALSE(SocketAccepts(dir.Sub("plain")));
  EXPECT_FALSE(SocketAccepts("/" + std::string(200, 'a')));  // too long for sun_path
}

TEST(FilesTest, ListSocketsListsOnlyVisibleSocketsSorted) {
  testing::ShortTempDir dir;
  MakeSocketFile(dir.Sub("b.sock"));
  MakeSocketFile(dir.Sub("a.sock"));
  MakeSocketFile(dir.Sub(".hidden.sock"));
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("plain"), "x").ok());
  ASSERT_TRUE(MakeDirs(dir.Sub("sub")).ok());
  EXPECT_THAT(ListSockets(dir.path()), ElementsAre(dir.Sub("a.sock"), dir.Sub("b.sock")));
  EXPECT_TRUE(ListSockets(dir.Sub("missing")).empty());
}

TEST(FilesTest, RemoveStaleSocketsRemovesOnlySockets) {
  testing::ShortTempDir dir;
  testing::ShortTempDir elsewhere;
  MakeSocketFile(dir.Sub("old-plugin.sock"));
  MakeSocketFile(dir.Sub("kubelet.sock"));
  MakeSocketFile(elsewhere.Sub("their.sock"));
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("kubelet_internal_checkpoint"), "{}").ok());
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("notes.txt"), "keep me").ok());
  ASSERT_TRUE(MakeDirs(dir.Sub("subdir")).ok());
  MakeSocketFile(dir.Sub("subdir/inner.sock"));
  // A link to a socket elsewhere: neither the link nor its target goes.
  ASSERT_EQ(::symlink(elsewhere.Sub("their.sock").c_str(), dir.Sub("link.sock").c_str()), 0);
  absl::StatusOr<std::vector<std::string>> removed = RemoveStaleSockets(dir.path());
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre("kubelet.sock", "old-plugin.sock"));
  EXPECT_EQ(*ReadFile(dir.Sub("kubelet_internal_checkpoint")), "{}");
  EXPECT_EQ(*ReadFile(dir.Sub("notes.txt")), "keep me");
  EXPECT_TRUE(PathExists(dir.Sub("subdir/inner.sock")));
  EXPECT_TRUE(PathExists(dir.Sub("link.sock")));
  EXPECT_TRUE(PathExists(elsewhere.Sub("their.sock")));
  // A link in place of the directory itself is not followed.
  ASSERT_EQ(::symlink(elsewhere.path().c_str(), dir.Sub("via-link").c_str()), 0);
  absl::StatusOr<std::vector<std::string>> through = RemoveStaleSockets(dir.Sub("via-link"));
  EXPECT_FALSE(through.ok());
  EXPECT_TRUE(PathExists(elsewhere.Sub("their.sock")));
}

// A socket a process listens on is a running plugin's (one that started a
// moment before dpproxy, say): it stays; one nobody listens on goes.
TEST(FilesTest, RemoveStaleSocketsKeepsASocketSomeoneListensOn) {
  testing::ShortTempDir dir;
  testing::SilentSocket live(dir.Sub("live.sock"));  // listens, never accepts
  MakeSocketFile(dir.Sub("gone.sock"));
  absl::StatusOr<std::vector<std::string>> removed = RemoveStaleSockets(dir.path());
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre("gone.sock"));
  EXPECT_TRUE(PathExists(dir.Sub("live.sock")));
}

TEST(FilesTest, IsSameOrInsideComparesByIdentityNotSpelling) {
  testing::ShortTempDir root;
  ASSERT_TRUE(MakeDirs(root.Sub("kubelet/device-plugins")).ok());
  ASSERT_TRUE(MakeDirs(root.Sub("kubelet/plugins_registry")).ok());
  ASSERT_TRUE(MakeDirs(root.Sub("dpproxy/device-plugins")).ok());
  const std::string kubelet = root.Sub("kubelet");
  EXPECT_TRUE(IsSameOrInside(kubelet, kubelet));
  EXPECT_TRUE(IsSameOrInside(root.Sub("kubelet/plugins_registry"), kubelet));
  EXPECT_TRUE(IsSameOrInside(root.Sub("kubelet/device-plugins/../device-plugins"), kubelet));
  EXPECT_TRUE(IsSameOrInside(root.Sub("kubelet/device-plugins/"), kubelet));
  EXPECT_TRUE(IsSameOrInside(root.Sub("kubelet/not-yet/made"), kubelet));
  ASSERT_EQ(::symlink(root.Sub("kubelet/device-plugins").c_str(), root.Sub("alias").c_str()), 0);
  EXPECT_TRUE(IsSameOrInside(root.Sub("alias"), kubelet));
  EXPECT_TRUE(IsSameOrInside(root.Sub("alias"), root.Sub("kubelet/device-plugins")));
  EXPECT_FALSE(IsSameOrInside(root.Sub("dpproxy/device-plugins"), kubelet));
  EXPECT_FALSE(IsSameOrInside(root.Sub("kubelet-other"), kubelet));
  EXPECT_FALSE(IsSameOrInside(kubelet, root.Sub("kubelet/device-plugins")));
}

TEST(FilesTest, CheckOwnDirectoryRefusesDirectoriesOthersCanWrite) {
  testing::ShortTempDir dir;
  ASSERT_TRUE(MakeDirs(dir.Sub("ok")).ok());
  ASSERT_EQ(::chmod(dir.Sub("ok").c_str(), 0755), 0);
  EXPECT_TRUE(CheckOwnDirectory(dir.Sub("ok")).ok());
  ASSERT_TRUE(MakeDirs(dir.Sub("open")).ok());
  ASSERT_EQ(::chmod(dir.Sub("open").c_str(), 0777), 0);
  absl::Status s = CheckOwnDirectory(dir.Sub("open"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("writable by every user"));
  if (::geteuid() == 0) {
    ASSERT_TRUE(MakeDirs(dir.Sub("theirs")).ok());
    ASSERT_EQ(::chown(dir.Sub("theirs").c_str(), 65534, 65534), 0);
    s = CheckOwnDirectory(dir.Sub("theirs"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("owned by uid 65534"));
  }
}

TEST(FilesTest, WriteFileAtomicNeverWritesThroughAPlantedLink) {
  testing::ShortTempDir dir;
  testing::ShortTempDir elsewhere;
  const std::string victim = elsewhere.Sub("passwd");
  ASSERT_TRUE(WriteFileAtomic(victim, "root:x:0:0").ok());
  const std::string path = dir.Sub("status.json");
  // Links planted at the old fixed temporary name and at the file itself.
  ASSERT_EQ(::symlink(victim.c_str(), (path + ".tmp").c_str()), 0);
  ASSERT_TRUE(WriteFileAtomic(path, "one").ok());
  EXPECT_EQ(*ReadFile(victim), "root:x:0:0");
  ::unlink(path.c_str());
  ASSERT_EQ(::symlink(victim.c_str(), path.c_str()), 0);
  ASSERT_TRUE(WriteFileAtomic(path, "two").ok());
  EXPECT_EQ(*ReadFile(victim), "root:x:0:0");  // the link was replaced, not followed
  EXPECT_EQ(*ReadFile(path), "two");
  EXPECT_EQ(ReadOwnFile(dir.Sub("status.json.tmp")).status().code(),
            absl::StatusCode::kFailedPrecondition);  // a link: refused
}

TEST(FilesTest, WriteFileAtomicSetsTheModeWhateverTheUmask) {
  testing::ShortTempDir dir;
  const mode_t old = ::umask(0);
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("a"), "x", 0640).ok());
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("b"), "x").ok());
  ::umask(old);
  struct stat st;
  ASSERT_EQ(::stat(dir.Sub("a").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  ASSERT_EQ(::stat(dir.Sub("b").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST(EventLogTest, NeverAppendsThroughAPlantedLinkAndIs0640) {
  testing::ShortTempDir dir;
  testing::ShortTempDir elsewhere;
  const std::string victim = elsewhere.Sub("shadow");
  ASSERT_TRUE(WriteFileAtomic(victim, "secret").ok());
  ASSERT_EQ(::symlink(victim.c_str(), dir.Sub("events.jsonl").c_str()), 0);
  EventLog log("test");
  absl::Status s = log.OpenFile(dir.Sub("events.jsonl"));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("symbolic link"));
  log.Emit("hello");
  EXPECT_EQ(*ReadFile(victim), "secret");
  const mode_t old = ::umask(0);
  ASSERT_TRUE(log.OpenFile(dir.Sub("own.jsonl")).ok());
  ::umask(old);
  struct stat st;
  ASSERT_EQ(::stat(dir.Sub("own.jsonl").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
}

// A hard link planted at the events file's name (in the same file system)
// is refused: neither the other file's contents nor its mode change.
TEST(EventLogTest, NeverAppendsThroughAPlantedHardLink) {
  testing::ShortTempDir dir;
  const std::string victim = dir.Sub("victim");
  ASSERT_TRUE(WriteFileAtomic(victim, "secret", 0600).ok());
  ASSERT_EQ(::link(victim.c_str(), dir.Sub("events.jsonl").c_str()), 0);
  EventLog log("test");
  absl::Status s = log.OpenFile(dir.Sub("events.jsonl"));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("has 2 hard links"));
  log.Emit("hello");
  EXPECT_EQ(*ReadFile(victim), "secret");
  struct stat st;
  ASSERT_EQ(::stat(victim.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
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

// A process's executable, also once the file was replaced on disk (as a
// package upgrade replaces a running binary).
TEST(FilesTest, ExecutableOfAProcessEvenOnceItsFileIsGone) {
  const std::optional<std::string> self = ExecutableOf("self");
  ASSERT_TRUE(self.has_value());
  EXPECT_TRUE(absl::EndsWith(*self, "/files_test")) << *self;
  EXPECT_FALSE(ExecutableOf("0").has_value());  // no such process

  testing::ShortTempDir dir;
  const std::string copy = dir.Sub("sleeper");
  absl::StatusOr<std::string> bytes = ReadFile("/bin/sleep");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_TRUE(WriteFileAtomic(copy, *bytes, 0755).ok());
  ChildSpec spec;
  spec.argv = {copy, "60"};
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  const std::string pid = absl::StrCat((*child)->pid());
  // The child runs `copy` once its exec is done.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (ExecutableOf(pid) != copy && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(ExecutableOf(pid), copy);
  ASSERT_EQ(::unlink(copy.c_str()), 0);
  EXPECT_EQ(ExecutableOf(pid), copy);  // not "... (deleted)"
  (*child)->Stop(absl::Seconds(5));
}

TEST(DirWatcherTest, ReportsCreateAndDeleteAndTicks) {
  testing::ShortTempDir dir;
  std::mutex mu;
  std::condition_variable changed;
  std::vector<std::string> seen;
  std::atomic<int> ticks{0};
  DirWatcher w(dir.path(), [&](const DirWatcher::Event& e) {
    if (e.kind == DirWatcher::Event::kTick) {
      ++ticks;
      return;
    }
    std::lock_guard<std::mutex> l(mu);
    changed.notify_all();
    seen.push_back((e.kind == DirWatcher::Event::kCreated     ? "+"
                    : e.kind == DirWatcher::Event::kMovedAway ? "~"
                                                              : "-") +
                   e.name);
  });
  ASSERT_TRUE(w.Start().ok());
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("x"), "").ok());  // creates x.tmp, renames to x
  ::unlink(dir.Sub("x").c_str());
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(changed.wait_for(l, std::chrono::seconds(5), [&] {
      return std::find(seen.begin(), seen.end(), "-x") != seen.end();
    })) << "no delete event";
    EXPECT_NE(std::find(seen.begin(), seen.end(), "+x"), seen.end());
    // The temporary file was renamed to x: moved away, not deleted.
    int moved = 0, deleted_tmp = 0;
    for (const std::string& s : seen) {
      moved += absl::StartsWith(s, "~x.tmp.") ? 1 : 0;
      deleted_tmp += absl::StartsWith(s, "-x.tmp.") ? 1 : 0;
    }
    EXPECT_EQ(moved, 1);
    EXPECT_EQ(deleted_tmp, 0);
  }
  EXPECT_GE(ticks.load(), 1);  // the first tick comes at once, before any event
  w.Stop();
  w.Stop();  // idempotent
}

// A listener hears each event once it is in memory, outside the log's
// lock (it may read the log), and from every thread that emits.
TEST(EventLogTest, ListenersHearEveryEventOutsideTheLock) {
  EventLog log("test");
  std::atomic<int> heard{0};
  std::atomic<int> size_seen{0};
  log.AddListener([&] {
    size_seen = static_cast<int>(log.Size());  // would deadlock under the lock
    ++heard;
  });
  log.Emit("one");
  EXPECT_EQ(heard.load(), 1);
  EXPECT_EQ(size_seen.load(), 1);  // the event was in memory already
  std::thread other([&] { log.Emit("two"); });
  other.join();
  EXPECT_EQ(heard.load(), 2);
  EXPECT_EQ(size_seen.load(), 2);
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

// Each event carries its time as RFC 3339 in UTC with milliseconds, its
// source and its name; a field of the same name wins. Counts are per event
// name and "resource" field.
TEST(EventLogTest, StampsEventsAndCountsThemPerResource) {
  EventLog log("test");
  const absl::Time before = absl::Now();
  log.Emit("allocate", {{"resource", "vendor.com/gpu"}});
  log.Emit("allocate", {{"resource", "vendor.com/gpu"}});
  log.Emit("allocate", {{"resource", "vendor.com/nic"}});
  log.Emit("started");
  log.Emit("custom", {{"source", "elsewhere"}, {"resource", 7}});
  const absl::Time after = absl::Now();
  std::vector<Json> events = log.Snapshot();
  ASSERT_EQ(events.size(), 5u);
  for (const Json& e : events) {
    const std::string ts = e.value("ts", "");
    ASSERT_EQ(ts.size(), 24u) << ts;
    EXPECT_EQ(ts[10], 'T');
    EXPECT_EQ(ts[19], '.');
    EXPECT_EQ(ts.back(), 'Z');
    absl::Time t;
    std::string err;
    ASSERT_TRUE(absl::ParseTime("%Y-%m-%dT%H:%M:%E3SZ", ts, absl::UTCTimeZone(), &t, &err))
        << ts << ": " << err;
    EXPECT_GE(t, absl::FromUnixMillis(absl::ToUnixMillis(before))) << ts;
    EXPECT_LE(t, after) << ts;
  }
  EXPECT_EQ(events[0]["source"], "test");
  EXPECT_EQ(events[0]["event"], "allocate");
  EXPECT_EQ(events[4]["source"], "elsewhere");
  EXPECT_EQ(events[4]["event"], "custom");
  const auto counts = log.Counts();
  EXPECT_EQ(counts.size(), 4u);
  EXPECT_EQ(counts.at({"allocate", "vendor.com/gpu"}), 2);
  EXPECT_EQ(counts.at({"allocate", "vendor.com/nic"}), 1);
  EXPECT_EQ(counts.at({"started", ""}), 1);
  EXPECT_EQ(counts.at({"custom", ""}), 1);  // a resource that is not a string
}

// With no history, an event nothing else takes is only counted, and
// counted as one that is kept would be; one that goes to a file still
// goes there whole.
TEST(EventLogTest, WithoutHistoryEventsAreCountedAndStillWritten) {
  testing::ShortTempDir dir;
  EventLog log("test");
  log.SetHistory(0);
  log.Emit("allocate", {{"resource", "vendor.com/gpu"}});
  log.Emit("allocate", {{"resource", "vendor.com/gpu"}, {"containers", 2}});
  log.Emit("custom", {{"resource", 7}});
  log.Emit("renamed", {{"event", "other"}});
  EXPECT_TRUE(log.Snapshot().empty());
  EXPECT_EQ(log.Size(), 4u);
  auto counts = log.Counts();
  EXPECT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts.at({"allocate", "vendor.com/gpu"}), 2);
  EXPECT_EQ(counts.at({"custom", ""}), 1);
  EXPECT_EQ(counts.at({"other", ""}), 1);

  ASSERT_TRUE(log.OpenFile(dir.Sub("events.jsonl")).ok());
  log.Emit("allocate", {{"resource", "vendor.com/nic"}});
  EXPECT_TRUE(log.Snapshot().empty());
  EXPECT_EQ(log.Size(), 5u);
  EXPECT_EQ(log.Counts().at({"allocate", "vendor.com/nic"}), 1);
  Json line = Json::parse(*ReadFile(dir.Sub("events.jsonl")));
  EXPECT_EQ(line["event"], "allocate");
  EXPECT_EQ(line["resource"], "vendor.com/nic");
  EXPECT_EQ(line["source"], "test");

  std::atomic<int> heard{0};
  log.AddListener([&] { ++heard; });
  log.Emit("started");
  EXPECT_EQ(heard.load(), 1);
  EXPECT_EQ(log.Counts().at({"started", ""}), 1);
}

// A per-call event's fields are made only when something takes the event;
// it is counted either way.
TEST(EventLogTest, PerCallEventsAreMadeOnlyWhenTaken) {
  EventLog log("test");
  int made = 0;
  auto fields = [&made] {
    ++made;
    return Json{{"resource", "vendor.com/gpu"}, {"containers", 1}};
  };
  log.SetHistory(0);
  log.EmitPerCall("allocate", "vendor.com/gpu", fields);
  EXPECT_EQ(made, 0);
  EXPECT_EQ(log.Size(), 1u);
  log.SetHistory(4);
  log.EmitPerCall("allocate", "vendor.com/gpu", fields);
  EXPECT_EQ(made, 1);
  ASSERT_EQ(log.Snapshot().size(), 1u);
  EXPECT_EQ(log.Snapshot()[0]["containers"], 1);
  EXPECT_EQ(log.Snapshot()[0]["event"], "allocate");
  EXPECT_EQ(log.Size(), 2u);
  EXPECT_EQ(log.Counts().at({"allocate", "vendor.com/gpu"}), 2);
}

TEST(EventLogTest, HistoryIsBoundedButIndicesStayAbsolute) {
  testing::ShortTempDir dir;
  EventLog log("test", /*history=*/3);
  ASSERT_TRUE(log.OpenFile(dir.Sub("events.jsonl")).ok());
  for (int i = 0; i < 5; ++i) log.Emit("e", {{"n", i}});
  EXPECT_EQ(log.Size(), 5u);
  // Since: by absolute index, only what is still in memory.
  std::vector<Json> since = log.Since(3);
  ASSERT_EQ(since.size(), 2u);
  EXPECT_EQ(since[0]["n"], 3);
  EXPECT_EQ(log.Since(0).size(), 3u);
  EXPECT_EQ(log.Since(0).front()["n"], 2);
  EXPECT_TRUE(log.Since(5).empty());
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
