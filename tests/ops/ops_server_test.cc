// The operators' HTTP endpoints over a real TCP socket: probes answer 200
// "ok" or 500 with every check listed (and list them on ?verbose, as the
// Kubernetes API server does), /metrics serves the Prometheus text of its
// collectables, and paths are matched exactly.
#include "proxy/ops/ops_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <iostream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace dpproxy {
namespace {

struct Reply {
  int status = 0;
  std::string body;
  std::string headers;
};

// One HTTP/1.0 GET to 127.0.0.1:port, read to the end.
Reply Get(int port, const std::string& path) {
  Reply r;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "cannot connect to port " << port;
    ::close(fd);
    return r;
  }
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
  EXPECT_EQ(::write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string all;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) all.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const size_t split = all.find("\r\n\r\n");
  EXPECT_NE(split, std::string::npos) << all;
  if (split == std::string::npos) return r;
  r.headers = all.substr(0, split);
  r.body = all.substr(split + 4);
  if (all.rfind("HTTP/1.", 0) == 0) r.status = std::atoi(all.c_str() + 9);
  return r;
}

class OpsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto family = &prometheus::BuildCounter().Name("dpproxy_test_total").Help("A test counter.")
                       .Register(*registry_);
    family->Add({{"resource", "vendor.com/gpu"}}).Increment(3);
    OpsHandlers h;
    h.live = [this] {
      return std::vector<HealthCheck>{{"housekeeping", live_.load(), live_ ? "" : "stuck for 31s"}};
    };
    h.ready = [this] {
      return std::vector<HealthCheck>{
          {"registered:vendor.com/gpu", registered_.load(),
           registered_ ? "" : "not registered with the kubelet yet"},
          {"state-writable", true, ""}};
    };
    h.metrics.push_back(registry_);
    auto s = OpsServer::Start("127.0.0.1:0", std::move(h));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    ASSERT_GT(server_->port(), 0);
  }

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::atomic<bool> live_{true}, registered_{false};
  std::unique_ptr<OpsServer> server_;
};

TEST_F(OpsServerTest, ReadyzListsWhatFailsAndPassesOnceEveryCheckDoes) {
  Reply r = Get(server_->port(), "/readyz");
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(r.body,
            "[-]registered:vendor.com/gpu failed: not registered with the kubelet yet\n"
            "[+]state-writable ok\n"
            "readyz check failed\n");
  registered_ = true;
  r = Get(server_->port(), "/readyz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok");
  r = Get(server_->port(), "/readyz?verbose");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body,
            "[+]registered:vendor.com/gpu ok\n[+]state-writable ok\nreadyz check passed\n");
  EXPECT_NE(r.headers.find("Cache-Control: no-store"), std::string::npos) << r.headers;
}

TEST_F(OpsServerTest, LivezAndHealthzFollowTheLivenessChecks) {
  EXPECT_EQ(Get(server_->port(), "/livez").status, 200);
  EXPECT_EQ(Get(server_->port(), "/healthz").body, "ok");
  live_ = false;
  Reply r = Get(server_->port(), "/livez");
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(r.body, "[-]housekeeping failed: stuck for 31s\nlivez check failed\n");
  EXPECT_EQ(Get(server_->port(), "/healthz").body,
            "[-]housekeeping failed: stuck for 31s\nhealthz check failed\n");
}

TEST_F(OpsServerTest, MetricsServeThePrometheusTextOfTheCollectables) {
  Reply r = Get(server_->port(), "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.headers.find("text/plain; version=0.0.4"), std::string::npos) << r.headers;
  EXPECT_NE(r.body.find("# TYPE dpproxy_test_total counter"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("dpproxy_test_total{resource=\"vendor.com/gpu\"} 3"), std::string::npos)
      << r.body;
}

TEST_F(OpsServerTest, PathsMatchExactly) {
  EXPECT_EQ(Get(server_->port(), "/livez/extra").status, 404);
  EXPECT_EQ(Get(server_->port(), "/readyzz").status, 404);
  EXPECT_EQ(Get(server_->port(), "/").status, 404);
}

TEST(OpsServerStartTest, AnAddressInUseIsNamed) {
  auto first = OpsServer::Start("127.0.0.1:0", OpsHandlers());
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = OpsServer::Start(taken, OpsHandlers());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(taken), absl::string_view::npos) << second.status();
}

// A TCP connection to 127.0.0.1:port that the test writes to as it likes.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "cannot connect to port " << port;
  }
  return fd;
}

// Everything the server sends on `fd` until it closes the connection, or
// what came before `timeout` passed.
std::string ReadToEnd(int fd, absl::Duration timeout) {
  std::string all;
  const absl::Time until = absl::Now() + timeout;
  for (;;) {
    pollfd p = {fd, POLLIN, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(until - absl::Now()));
    if (ms <= 0 || ::poll(&p, 1, ms) <= 0) break;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    all.append(buf, static_cast<size_t>(n));
  }
  return all;
}

class SlowClientTest : public ::testing::Test {
 protected:
  void Start(const OpsServer::Options& o) {
    OpsHandlers h;
    h.live = [] { return std::vector<HealthCheck>{{"housekeeping", true, ""}}; };
    auto s = OpsServer::Start("127.0.0.1:0", std::move(h), o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  void TearDown() override {
    for (int fd : open_) ::close(fd);
  }
  int Open() {
    const int fd = Connect(server_->port());
    open_.push_back(fd);
    return fd;
  }
  std::unique_ptr<OpsServer> server_;
  std::vector<int> open_;
};

// 100 clients that sent half a request and stopped hold no thread: the
// probes answer while they are all connected (their timeout is far off).
TEST_F(SlowClientTest, ProbesAnswerWhileAHundredClientsSendNothing) {
  OpsServer::Options o;
  o.request_timeout = absl::Minutes(5);
  Start(o);
  // The slowest of 20 probes, each on a connection of its own.
  auto probes = [&] {
    absl::Duration slowest;
    for (int i = 0; i < 20; ++i) {
      const char* path = i % 2 == 0 ? "/livez" : "/healthz";
      const absl::Time start = absl::Now();
      Reply r = Get(server_->port(), path);
      slowest = std::max(slowest, absl::Now() - start);
      EXPECT_EQ(r.status, 200) << path;
      EXPECT_EQ(r.body, "ok") << path;
    }
    return slowest;
  };
  const absl::Duration alone = probes();
  for (int i = 0; i < 100; ++i) {
    const int fd = Open();
    ASSERT_EQ(::write(fd, "GET /livez HTTP/1.1\r\nHost: x\r\n", 30), 30);
  }
  const absl::Duration beside_slow = probes();
  // Not a limit (shared machines are noisy): the figures side by side, for
  // docs/benchmarks.md.
  std::cout << "slowest of 20 probes: alone " << alone << ", with 100 slow clients connected "
            << beside_slow << "\n";
}

// A client that does not deliver its request in time is answered 408 and
// closed.
TEST_F(SlowClientTest, ARequestThatDoesNotArriveInTimeIsClosed) {
  OpsServer::Options o;
  o.request_timeout = absl::Milliseconds(200);
  Start(o);
  const int fd = Open();
  ASSERT_EQ(::write(fd, "GET /livez", 10), 10);
  const std::string got = ReadToEnd(fd, absl::Seconds(30));
  EXPECT_TRUE(absl::StartsWith(got, "HTTP/1.1 408 Request Timeout\r\n")) << got;
}

// Past the connection limit, the oldest connection whose request has not
// come is closed to make room: clients that hold every slot idle, and open
// another as each is closed, never keep a probe out (they answered 503
// once all 256 slots were held).
TEST_F(SlowClientTest, IdleClientsHoldingEverySlotNeverKeepAProbeOut) {
  // A thousand client sockets and the server's own in one process.
  rlimit files;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  files.rlim_cur = std::min<rlim_t>(files.rlim_max, 4096);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &files), 0);
  const int clients = static_cast<int>(std::min<rlim_t>(1000, files.rlim_cur - 512));
  OpsServer::Options o;
  o.request_timeout = absl::Minutes(5);
  Start(o);
  std::vector<int> idle;
  for (int i = 0; i < clients; ++i) idle.push_back(Connect(server_->port()));
  // Those the server closed connect again, as a client that keeps the
  // slots held does; each probe is answered meanwhile.
  for (int round = 0; round < 3; ++round) {
    int reconnected = 0;
    for (int& fd : idle) {
      pollfd p = {fd, POLLIN, 0};
      if (::poll(&p, 1, 0) == 1) {
        char b;
        if (::read(fd, &b, 1) <= 0) {
          ::close(fd);
          fd = Connect(server_->port());
          ++reconnected;
        }
      }
    }
    for (int i = 0; i < 5; ++i) {
      Reply r = Get(server_->port(), "/livez");
      EXPECT_EQ(r.status, 200) << "round " << round << ": " << r.body;
    }
    std::cout << "round " << round << ": " << reconnected << " idle clients connected again\n";
  }
  for (int fd : idle) ::close(fd);
}

TEST_F(SlowClientTest, ALongRequestIsRefused) {
  OpsServer::Options o;
  o.max_request_bytes = 1024;
  Start(o);
  const int fd = Open();
  const std::string req = "GET /livez HTTP/1.1\r\nX-Long: " + std::string(2000, 'a') + "\r\n\r\n";
  ASSERT_EQ(::write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  const std::string got = ReadToEnd(fd, absl::Seconds(30));
  EXPECT_TRUE(absl::StartsWith(got, "HTTP/1.1 431 ")) << got;
}

TEST_F(SlowClientTest, OnlyGetAndHeadAreServed) {
  Start(OpsServer::Options());
  int fd = Open();
  ASSERT_EQ(::write(fd, "POST /livez HTTP/1.1\r\n\r\n", 24), 24);
  std::string got = ReadToEnd(fd, absl::Seconds(30));
  EXPECT_TRUE(absl::StartsWith(got, "HTTP/1.1 405 ")) << got;
  EXPECT_NE(got.find("Allow: GET, HEAD\r\n"), std::string::npos) << got;
  fd = Open();
  ASSERT_EQ(::write(fd, "HEAD /livez HTTP/1.1\r\n\r\n", 24), 24);
  got = ReadToEnd(fd, absl::Seconds(30));
  EXPECT_TRUE(absl::StartsWith(got, "HTTP/1.1 200 OK\r\n")) << got;
  EXPECT_TRUE(absl::EndsWith(got, "\r\n\r\n")) << "HEAD has no body: " << got;
  fd = Open();
  ASSERT_EQ(::write(fd, "hello\r\n\r\n", 9), 9);
  got = ReadToEnd(fd, absl::Seconds(30));
  EXPECT_TRUE(absl::StartsWith(got, "HTTP/1.1 400 ")) << got;
}

// A listening socket handed over (as a dpproxy taking over gets its
// predecessor's) is served as it is; one on another address is refused.
TEST(OpsServerHandoverTest, AHandedOverListenerIsServedOnlyForItsAddress) {
  OpsHandlers h;
  h.live = [] { return std::vector<HealthCheck>{{"housekeeping", true, ""}}; };
  auto first = OpsServer::Start("127.0.0.1:0", h);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  OpsServer::Options o;
  o.listener_fd = ::dup((*first)->listener_fd());
  auto second = OpsServer::Start(address, h, o);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->port(), port);
  first->reset();  // the predecessor exits: the same address answers
  EXPECT_EQ(Get(port, "/livez").status, 200);
  o.listener_fd = ::dup((*second)->listener_fd());
  auto elsewhere = OpsServer::Start("127.0.0.2:9464", h, o);
  ASSERT_FALSE(elsewhere.ok());
  EXPECT_THAT(std::string(elsewhere.status().message()),
              ::testing::HasSubstr(absl::StrCat("listens on 127.0.0.1 port ", port)));
}

// A listener handed over by a dpproxy in another pod listens in that
// pod's network namespace: connections to this one's address never reach
// it. It is refused (kFailedPrecondition, naming why), and the address,
// free in this namespace, is bound here. (The other namespace is made on a
// thread of its own: unshare(CLONE_NEWNET) moves only the calling thread.)
TEST(OpsServerHandoverTest, AListenerOfAnotherNetworkNamespaceIsRefusedAndTheAddressBoundHere) {
  OpsHandlers h;
  h.live = [] { return std::vector<HealthCheck>{{"housekeeping", true, ""}}; };
  // A port free here, to bind there as well.
  auto probe = OpsServer::Start("127.0.0.1:0", h);
  ASSERT_TRUE(probe.ok()) << probe.status();
  const int port = (*probe)->port();
  probe->reset();
  int theirs = -1;
  std::string error;
  std::thread([&] {
    if (::unshare(CLONE_NEWNET) != 0) {
      error = absl::StrCat("unshare(CLONE_NEWNET): ", std::strerror(errno),
                           " (the test needs CAP_SYS_ADMIN: run it as root)");
      return;
    }
    theirs = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(theirs, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(theirs, 4) != 0) {
      error = absl::StrCat("bind in the new namespace: ", std::strerror(errno));
    }
  }).join();
  ASSERT_TRUE(error.empty()) << error;
  const std::string address = absl::StrCat("0.0.0.0:", port);
  OpsServer::Options o;
  o.listener_fd = theirs;
  auto handed = OpsServer::Start(address, h, o);
  ASSERT_FALSE(handed.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(handed.status())) << handed.status();
  EXPECT_THAT(std::string(handed.status().message()),
              ::testing::HasSubstr("in another network namespace"));
  EXPECT_EQ(::fcntl(theirs, F_GETFD), -1) << "the refused listener was not closed";
  auto own = OpsServer::Start(address, h);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(Get(port, "/livez").status, 200);
}

// A dpproxy taking over serves the handed-over listener only once it says
// so (accept_later, then Accept()): until then every connection is the
// running one's, and one queued meanwhile is answered once it accepts.
TEST(OpsServerHandoverTest, AListenerServedLaterTakesNoConnectionUntilAccept) {
  OpsHandlers running;
  running.ready = [] { return std::vector<HealthCheck>{{"running-one", true, ""}}; };
  auto first = OpsServer::Start("127.0.0.1:0", running);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  OpsHandlers starting;
  starting.ready = [] {
    return std::vector<HealthCheck>{{"started", false, "dpproxy is starting"}};
  };
  OpsServer::Options o;
  o.listener_fd = ::dup((*first)->listener_fd());
  o.accept_later = true;
  auto second = OpsServer::Start(absl::StrCat("127.0.0.1:", port), starting, o);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE((*second)->accepting());
  for (int i = 0; i < 50; ++i) {
    const Reply r = Get(port, "/readyz?verbose");
    ASSERT_EQ(r.status, 200) << "answered by the one not accepting yet: " << r.body;
    ASSERT_THAT(r.body, ::testing::HasSubstr("[+]running-one ok"));
  }
  first->reset();  // the running one exits: a connection waits in the queue
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string req = "GET /readyz HTTP/1.0\r\n\r\n";
  ASSERT_EQ(::write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  (*second)->Accept();
  EXPECT_TRUE((*second)->accepting());
  std::string all;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) all.append(buf, static_cast<size_t>(n));
  ::close(fd);
  EXPECT_TRUE(absl::StartsWith(all, "HTTP/1.1 500 ")) << all;
  EXPECT_THAT(all, ::testing::HasSubstr("dpproxy is starting"));
}

// A stop (the old dpproxy exiting after a handover, both having served
// the shared listener) answers the connections it accepted before it,
// even one whose request is still on its way: a probe there is answered,
// never cut off ("closed without a response"). New ones are not accepted.
TEST(OpsServerHandoverTest, AStopAnswersTheConnectionsItHadAccepted) {
  OpsHandlers h;
  h.live = [] { return std::vector<HealthCheck>{{"housekeeping", true, ""}}; };
  auto s = OpsServer::Start("127.0.0.1:0", std::move(h));
  ASSERT_TRUE(s.ok()) << s.status();
  const int port = (*s)->port();
  const int fd = Connect(port);
  const std::string head = "GET /livez HTTP/1.0\r\n";
  ASSERT_EQ(::write(fd, head.data(), head.size()), static_cast<ssize_t>(head.size()));
  // Answered after it: the server has accepted the first one too (it takes
  // every queued connection in turn).
  ASSERT_EQ(Get(port, "/livez").status, 200);
  std::thread stop([&] { s->reset(); });
  // The stop has begun once the listener refuses connections (polled with
  // a deadline): only then does the rest of the request go out.
  bool refused = false;
  for (const absl::Time until = absl::Now() + absl::Seconds(10); !refused && absl::Now() < until;) {
    const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    refused = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
              errno == ECONNREFUSED;
    ::close(probe);
    if (!refused) ::poll(nullptr, 0, 5);
  }
  ASSERT_TRUE(refused) << "the server never stopped listening";
  const std::string rest = "\r\n";
  ASSERT_EQ(::write(fd, rest.data(), rest.size()), static_cast<ssize_t>(rest.size()));
  const std::string answer = ReadToEnd(fd, absl::Seconds(10));
  ::close(fd);
  stop.join();
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 200 ")) << "[" << answer << "]";
}

TEST(ParseHostPortTest, AcceptsWhatTheMetricsAddressNamesAndRefusesTheRest) {
  EXPECT_EQ(ParseHostPort("127.0.0.1:9464")->host, "127.0.0.1");
  EXPECT_EQ(ParseHostPort("localhost:9464")->host, "127.0.0.1");
  EXPECT_EQ(ParseHostPort(":9464")->host, "0.0.0.0");
  EXPECT_EQ(ParseHostPort("[::1]:0")->host, "::1");
  EXPECT_EQ(ParseHostPort("[::1]:9464")->port, 9464);
  for (const char* bad : {"9464", "127.0.0.1", "example.com:80", "::1:9464", "[::1]9464",
                          "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:http", "[::1:80"}) {
    absl::StatusOr<HostPort> hp = ParseHostPort(bad);
    EXPECT_FALSE(hp.ok()) << bad;
    EXPECT_THAT(std::string(hp.status().message()), ::testing::HasSubstr(bad));
  }
}

TEST(AnswerProbeTest, NoChecksIsOk) {
  EXPECT_EQ(AnswerProbe("readyz", {}, false).body, "ok");
  EXPECT_EQ(AnswerProbe("readyz", {}, true).body, "readyz check passed\n");
}

// A check that passes may say what a reader should know (the devices
// cordoned by hand); only the verbose answer shows it.
TEST(AnswerProbeTest, APassingCheckShowsItsNoteWhenVerbose) {
  const std::vector<HealthCheck> checks = {
      {"registered:vendor.com/gpu", true, ""},
      {"cordoned:vendor.com/gpu", true, "1 device(s) cordoned: gpu-2 (fan failure)"}};
  EXPECT_EQ(AnswerProbe("readyz", checks, false).body, "ok");
  ProbeAnswer a = AnswerProbe("readyz", checks, true);
  EXPECT_EQ(a.http_status, 200);
  EXPECT_EQ(a.body,
            "[+]registered:vendor.com/gpu ok\n"
            "[+]cordoned:vendor.com/gpu ok: 1 device(s) cordoned: gpu-2 (fan failure)\n"
            "readyz check passed\n");
}

}  // namespace
}  // namespace dpproxy
