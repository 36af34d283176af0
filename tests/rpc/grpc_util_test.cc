#include "proxy/rpc/grpc_util.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <ctime>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server_builder.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

// What happened to each name in a directory, as inotify reported it
// between the watch's start and now (the kernel queues an event when the
// call that causes it returns, so nothing is still on its way).
class DirEvents {
 public:
  explicit DirEvents(const std::string& dir) {
    fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    ::inotify_add_watch(fd_, dir.c_str(), IN_CREATE | IN_ATTRIB | IN_MOVED_TO | IN_DELETE);
  }
  ~DirEvents() { ::close(fd_); }
  // "create NAME", "attrib NAME", "moved_to NAME", "delete NAME".
  std::vector<std::string> Read() {
    std::vector<std::string> out;
    alignas(inotify_event) char buf[8192];
    for (ssize_t n; (n = ::read(fd_, buf, sizeof(buf))) > 0;) {
      for (char* p = buf; p < buf + n;) {
        const auto* e = reinterpret_cast<const inotify_event*>(p);
        const std::string name = e->len > 0 ? e->name : "";
        const char* what = (e->mask & IN_CREATE)     ? "create "
                           : (e->mask & IN_ATTRIB)   ? "attrib "
                           : (e->mask & IN_MOVED_TO) ? "moved_to "
                                                     : "delete ";
        out.push_back(what + name);
        p += sizeof(inotify_event) + e->len;
      }
    }
    return out;
  }

 private:
  int fd_ = -1;
};

// A watcher of the directory sees the socket arrive once, with its mode,
// and never change after (no chmod a plugin could take for a new kubelet).
TEST(StartServerAtTest, TheSocketAppearsOnceWithItsMode) {
  testing::ShortTempDir dir;
  const std::string path = dir.Sub("kubelet.sock");
  DirEvents events(dir.path());
  grpc::CallbackGenericService any;
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&any);
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = StartServerAt(builder, path, 0700);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::string> seen;
  for (const std::string& e : events.Read()) {
    if (e.find("kubelet.sock") != std::string::npos) seen.push_back(e);
  }
  EXPECT_THAT(seen, ::testing::ElementsAre("moved_to kubelet.sock"));
  struct stat st;
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  // Nothing else is left beside it.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::ElementsAre("kubelet.sock"));
  absl::StatusOr<std::shared_ptr<grpc::Channel>> c = DialUnixChannel(path, absl::Seconds(10));
  EXPECT_TRUE(c.ok()) << c.status();
  (*server)->Shutdown();
}

// A stale socket is replaced; anything else at the path is refused by name
// and left alone.
TEST(StartServerAtTest, ReplacesASocketAndNothingElse) {
  testing::ShortTempDir dir;
  grpc::CallbackGenericService any;
  const std::string stale = dir.Sub("stale.sock");
  {
    testing::SilentSocket old(stale);
    ASSERT_GE(old.fd(), 0);
  }
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&any);
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = StartServerAt(builder, stale, 0700);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(DialUnixChannel(stale, absl::Seconds(10)).ok());
  (*server)->Shutdown();

  const std::string file = dir.Sub("notes.txt");
  ASSERT_TRUE(WriteFileAtomic(file, "keep me", 0644).ok());
  grpc::ServerBuilder other;
  other.RegisterCallbackGenericService(&any);
  absl::StatusOr<std::unique_ptr<grpc::Server>> refused = StartServerAt(other, file, 0700);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("is not a socket"));
  absl::StatusOr<std::string> kept = ReadFile(file);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, "keep me");
}

// Where a private directory would make the path too long for a socket, the
// socket is bound in place and still gets its mode.
TEST(StartServerAtTest, ALongPathIsServedInPlace) {
  testing::ShortTempDir dir;
  std::string deep = dir.path() + "/";
  deep += std::string(100 - deep.size(), 'd');
  ASSERT_EQ(::mkdir(deep.c_str(), 0700), 0);
  const std::string path = deep + "/k.sock";  // 107 bytes, the most a socket's path may have
  ASSERT_TRUE(ValidateSocketPath(path).ok());
  grpc::CallbackGenericService any;
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&any);
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = StartServerAt(builder, path, 0700);
  ASSERT_TRUE(server.ok()) << server.status();
  struct stat st;
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_TRUE(DialUnixChannel(path, absl::Seconds(10)).ok());
  (*server)->Shutdown();
}

// A dpproxy killed between making its private directory and renaming the
// socket out of it leaves the directory: the next start removes it once it
// is a minute old and holds no socket anyone listens on, and leaves
// everything else.
TEST(StartServerAtTest, LeftoversOfAKilledStartAreRemovedAndNothingElse) {
  testing::ShortTempDir dir;
  auto make_dir = [&](const std::string& name) {
    EXPECT_EQ(::mkdir(dir.Sub(name).c_str(), 0700), 0) << name;
    return dir.Sub(name);
  };
  auto age = [](const std::string& path) {  // two minutes old
    const timespec then{::time(nullptr) - 120, 0};
    const timespec times[2] = {then, then};
    EXPECT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
  };
  const std::string stale_socket = make_dir(".dpproxy-aaaaaa");
  { testing::SilentSocket gone(stale_socket + "/s"); }  // closed: a dead socket
  age(stale_socket);
  age(make_dir(".dpproxy-bbbbbb"));
  make_dir(".dpproxy-cccccc");  // a moment old: another dpproxy's, in use
  const std::string listened = make_dir(".dpproxy-dddddd");
  testing::SilentSocket alive(listened + "/s");
  ASSERT_GE(alive.fd(), 0);
  age(listened);
  const std::string with_file = make_dir(".dpproxy-eeeeee");
  ASSERT_TRUE(WriteFileAtomic(with_file + "/notes", "keep").ok());
  age(with_file);
  age(make_dir(".dpproxy-not-ours"));

  grpc::CallbackGenericService any;
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&any);
  absl::StatusOr<std::unique_ptr<grpc::Server>> server =
      StartServerAt(builder, dir.Sub("kubelet.sock"), 0700);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre(".dpproxy-cccccc", ".dpproxy-dddddd",
                                                      ".dpproxy-eeeeee", ".dpproxy-not-ours",
                                                      "kubelet.sock"));
  (*server)->Shutdown();
}

TEST(DialUnixChannelTest, ConnectsToAServerThatListens) {
  testing::ShortTempDir dir;
  const std::string path = dir.Sub("s.sock");
  grpc::CallbackGenericService any;  // a server needs something to serve
  grpc::ServerBuilder builder;
  builder.AddListeningPort(UnixAddress(path), grpc::InsecureServerCredentials());
  builder.RegisterCallbackGenericService(&any);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> c = DialUnixChannel(path, absl::Seconds(10));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->GetState(false), GRPC_CHANNEL_READY);
  server->Shutdown();
}

// A peer that accepts and never answers, and one that is not there: the
// dial ends at its deadline.
TEST(DialUnixChannelTest, EndsAtItsDeadline) {
  testing::ShortTempDir dir;
  testing::SilentSocket silent(dir.Sub("silent.sock"));
  ASSERT_GE(silent.fd(), 0);
  for (const std::string& path : {dir.Sub("silent.sock"), dir.Sub("missing.sock")}) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> c =
        DialUnixChannel(path, absl::Milliseconds(300));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << path;
  }
}

// Each connection a dial makes ends once its channel is gone. The peer
// accepts at once and answers each connection (an HTTP/2 SETTINGS frame,
// which is what a client waits for) only 200 ms later, as a busy kubelet
// does. A channel given up on while its connection was being set up once
// kept it open for good: one connection to the kubelet per slow
// registration.
TEST(DialUnixChannelTest, LeavesNoConnectionBehind) {
  testing::ShortTempDir dir;
  const std::string path = dir.Sub("late.sock");
  testing::SilentSocket listener(path);
  ASSERT_GE(listener.fd(), 0);
  ASSERT_EQ(::fcntl(listener.fd(), F_SETFL, O_NONBLOCK), 0);
  struct Conn {
    int fd;
    absl::Time answer_at;
    bool answered = false;
  };
  std::vector<Conn> open;
  int made = 0;
  // Serves the connections until `until` is true or the deadline passes.
  auto serve = [&](const std::function<bool()>& until, absl::Duration limit) {
    const absl::Time deadline = absl::Now() + limit;
    while (!until() && absl::Now() < deadline) {
      for (int fd; (fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK)) >= 0;) {
        open.push_back({fd, absl::Now() + absl::Milliseconds(200)});
        ++made;
      }
      for (auto it = open.begin(); it != open.end();) {
        if (!it->answered && absl::Now() >= it->answer_at) {
          static constexpr char kSettings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
          it->answered = ::write(it->fd, kSettings, sizeof(kSettings)) == sizeof(kSettings);
        }
        char buf[4096];
        ssize_t n;
        while ((n = ::read(it->fd, buf, sizeof(buf))) > 0) {
        }
        if (n == 0) {
          ::close(it->fd);
          it = open.erase(it);
        } else {
          ++it;
        }
      }
      pollfd fds[1] = {{listener.fd(), POLLIN, 0}};
      ::poll(fds, 1, 5);  // a new connection, or the next look at the open ones
    }
  };

  absl::StatusOr<std::shared_ptr<grpc::Channel>> c;
  std::atomic<bool> dialled{false};
  std::thread dial([&] {
    c = DialUnixChannel(path, absl::Seconds(10));
    dialled = true;
  });
  serve([&] { return dialled.load(); }, absl::Seconds(20));
  dial.join();
  ASSERT_TRUE(c.ok()) << c.status();
  c->reset();  // the dialled channel goes too
  serve([&] { return open.empty(); }, absl::Seconds(10));
  EXPECT_GE(made, 1);
  EXPECT_THAT(open, ::testing::IsEmpty()) << open.size() << " of " << made
                                          << " connections still open";
  for (const Conn& conn : open) ::close(conn.fd);
}

TEST(DialUnixChannelTest, StopsWhenCancelled) {
  testing::ShortTempDir dir;
  int asked = 0;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> c =
      DialUnixChannel(dir.Sub("missing.sock"), absl::Seconds(60), [&] { return ++asked > 2; });
  EXPECT_EQ(c.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(asked, 3);  // asked between slices, and no more
}

}  // namespace
}  // namespace dpproxy
