// The operators' HTTP endpoints over a real TCP socket: probes answer 200
// "ok" or 500 with every check listed (and list them on ?verbose, as the
// Kubernetes API server does), /metrics serves the Prometheus text of its
// collectables, and paths are matched exactly.
#include "proxy/ops/ops_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
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

TEST(AnswerProbeTest, NoChecksIsOk) {
  EXPECT_EQ(AnswerProbe("readyz", {}, false).body, "ok");
  EXPECT_EQ(AnswerProbe("readyz", {}, true).body, "readyz check passed\n");
}

}  // namespace
}  // namespace dpproxy
