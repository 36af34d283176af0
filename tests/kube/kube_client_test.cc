// The Kubernetes API client against a real HTTPS server on 127.0.0.1
// (cpp-httplib with a certificate made by openssl for this run): bearer
// tokens (and their rotation), CA verification, client certificates,
// Kubernetes Status errors mapped to codes, and the two ways of finding the
// API server (in-cluster, kubeconfig).
#include "proxy/kube/kube_client.h"

#include <httplib.h>

#include <atomic>
#include <functional>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/child_process.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// A self-signed certificate for 127.0.0.1 (its own CA), made by openssl.
void MakeCert(const std::string& dir, const std::string& name) {
  ChildSpec spec;
  spec.argv = {"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
               "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
               "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", dir + "/" + name + ".key",
               "-out", dir + "/" + name + ".crt"};
  spec.output_path = dir + "/openssl.log";
  absl::StatusOr<std::unique_ptr<ChildProcess>> p = ChildProcess::Start(spec);
  ASSERT_TRUE(p.ok()) << p.status();
  std::optional<int> status = (*p)->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value() && *status == 0) << *ReadFile(spec.output_path);
}

// An API server stand-in: one handler per method and path, and what the
// last request carried.
class FakeApiServer {
 public:
  FakeApiServer(const std::string& dir, bool want_client_cert = false)
      : server_(want_client_cert
                    ? httplib::SSLServer((dir + "/server.crt").c_str(),
                                         (dir + "/server.key").c_str(),
                                         (dir + "/client.crt").c_str())
                    : httplib::SSLServer((dir + "/server.crt").c_str(),
                                         (dir + "/server.key").c_str())) {
    server_.set_logger([this](const httplib::Request& req, const httplib::Response&) {
      absl::MutexLock lock(&mu_);
      last_auth_ = req.get_header_value("Authorization");
      last_body_ = req.body;
    });
    port_ = server_.bind_to_any_port("127.0.0.1");  // listening from here on
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() does nothing until the accept loop runs (see apiserver_sim.cc).
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!server_.is_running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  }
  ~FakeApiServer() {
    server_.stop();
    thread_.join();
  }
  httplib::SSLServer& http() { return server_; }
  std::string url() const { return absl::StrCat("https://127.0.0.1:", port_); }
  std::string last_auth() {
    absl::MutexLock lock(&mu_);
    return last_auth_;
  }
  std::string last_body() {
    absl::MutexLock lock(&mu_);
    return last_body_;
  }

 private:
  httplib::SSLServer server_;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::string last_auth_ ABSL_GUARDED_BY(mu_);
  std::string last_body_ ABSL_GUARDED_BY(mu_);
};

void Status(httplib::Response& res, int code, const std::string& reason,
            const std::string& message) {
  res.status = code;
  res.set_content(Json({{"kind", "Status"},
                        {"apiVersion", "v1"},
                        {"status", "Failure"},
                        {"reason", reason},
                        {"message", message},
                        {"code", code}})
                      .dump(),
                  "application/json");
}

class KubeClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeCert(dir_.path(), "server");
    MakeCert(dir_.path(), "other");
    MakeCert(dir_.path(), "client");
  }
  KubeConfig Config(const std::string& url) {
    KubeConfig c;
    c.server = url;
    c.ca_file = dir_.Sub("server.crt");
    c.token = "abc";
    c.source = "test";
    return c;
  }
  testing::ShortTempDir dir_;
};

TEST_F(KubeClientTest, RequestsCarryTheTokenAndAnswersAreJson) {
  FakeApiServer api(dir_.path());
  api.http().Get("/api", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"kind":"APIVersions","versions":["v1"]})", "application/json");
  });
  api.http().Post("/apis/x/v1/things", [](const httplib::Request& req, httplib::Response& res) {
    res.status = 201;
    res.set_content(req.body, "application/json");
  });
  absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(Config(api.url()));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Json> v = (*c)->Get("/api");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)["versions"][0], "v1");
  EXPECT_EQ(api.last_auth(), "Bearer abc");
  absl::StatusOr<Json> created = (*c)->Post("/apis/x/v1/things", Json({{"name", "a"}}));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ((*created)["name"], "a");
  EXPECT_EQ(Json::parse(api.last_body()), Json({{"name", "a"}}));
}


// A kubelet's metrics through the node proxy are text, not JSON: GetText
// gives the body as it came, and a refusal the code and reason the API
// server gave.
TEST_F(KubeClientTest, GetTextGivesATextAnswerAsItCame) {
  FakeApiServer api(dir_.path());
  const std::string metrics =
      "# TYPE plugin_manager_total_plugins gauge\n"
      "plugin_manager_total_plugins{socket_path=\"/r/a.sock\",state=\"actual_state_of_world\"} 1\n";
  api.http().Get("/api/v1/nodes/n/proxy/metrics",
                 [&metrics](const httplib::Request& req, httplib::Response& res) {
                   res.set_content(req.get_header_value("Accept") == "text/plain" ? metrics : "",
                                   "text/plain; version=0.0.4");
                 });
  api.http().Get("/api/v1/nodes/m/proxy/metrics", [](const httplib::Request&, httplib::Response& res) {
    Status(res, 403, "Forbidden", "nodes \"m\" is forbidden: cannot get resource nodes/proxy");
  });
  absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(Config(api.url()));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::string> text = (*c)->GetText("/api/v1/nodes/n/proxy/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, metrics);
  absl::StatusOr<std::string> refused = (*c)->GetText("/api/v1/nodes/m/proxy/metrics");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("GET /api/v1/nodes/m/proxy/metrics: HTTP 403 Forbidden"));
}
// An answer nested tens of thousands deep (120 KB) once ended dpproxy with
// SIGSEGV in a recursive walk: it is refused, naming the call and the
// depth, and an answer at the limit is read with its nulls dropped.
TEST_F(KubeClientTest, AnAnswerNestedTooDeepIsRefusedNamingIt) {
  FakeApiServer api(dir_.path());
  std::string deep;
  for (int i = 0; i < 60000; ++i) deep += "[";
  for (int i = 0; i < 60000; ++i) deep += "]";
  api.http().Get("/deep", [&deep](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"items\":" + deep + "}", "application/json");
  });
  // 64 levels: the outer object and 63 arrays, a null at the bottom.
  std::string fits = "{\"items\":";
  for (int i = 0; i < 63; ++i) fits += "[";
  fits += "null,1";
  for (int i = 0; i < 63; ++i) fits += "]";
  fits += ",\"gone\":null}";
  api.http().Get("/fits", [&fits](const httplib::Request&, httplib::Response& res) {
    res.set_content(fits, "application/json");
  });
  absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(Config(api.url()));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Json> v = (*c)->Get("/deep");
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(std::string(v.status().message()), ::testing::HasSubstr("/deep"));
  EXPECT_THAT(std::string(v.status().message()),
              ::testing::HasSubstr("nested more than 64 levels deep"));
  absl::StatusOr<Json> f = (*c)->Get("/fits");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->contains("gone"));
  const Json* bottom = &(*f)["items"];
  for (int i = 0; i < 62; ++i) bottom = &(*bottom)[0];
  EXPECT_EQ(*bottom, Json::array({1}));
}

// A plain-HTTP server on loopback that reads one request and then runs
// `answer` on the connection: it writes what a hostile API server writes,
// as slowly as it likes, and stops once the client has gone.
class RawServer {
 public:
  explicit RawServer(std::function<void(int fd)> answer) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(listen_fd_, 4), 0);
    socklen_t len = sizeof(a);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, answer = std::move(answer)] {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      answer(fd);
      ::close(fd);
    });
  }
  ~RawServer() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    thread_.join();
  }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }

  // Writes `text`; false once the client has gone.
  static bool Send(int fd, const std::string& text) {
    return ::send(fd, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size());
  }

 private:
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

KubeConfig PlainConfig(const std::string& url) {
  KubeConfig c;
  c.server = url;
  c.source = "test";
  return c;
}

// Endless header lines: the answer is not read past the header cap
// (64 KiB), and the call fails saying so (endless headers once took
// dpproxy to GBs).
TEST(KubeClientLimitsTest, EndlessHeaderLinesAreCutOff) {
  std::atomic<int> sent{0};
  RawServer server([&sent](int fd) {
    if (!RawServer::Send(fd, "HTTP/1.1 200 OK\r\n")) return;
    const std::string line = "X-Pad: " + std::string(1000, 'h') + "\r\n";
    for (int i = 0; i < 100000 && RawServer::Send(fd, line); ++i) ++sent;
  });
  absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(PlainConfig(server.url()));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Json> v = (*c)->Get("/api");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("header is over 64 KiB"));
  EXPECT_LT(sent.load(), 100000) << "the client read every header line";
}

// One header line without end: the same cap stops it.
TEST(KubeClientLimitsTest, AHeaderLineWithoutEndIsCutOff) {
  std::atomic<size_t> sent{0};
  RawServer server([&sent](int fd) {
    if (!RawServer::Send(fd, "HTTP/1.1 200 OK\r\nX-Big: ")) return;
    const std::string chunk(64 << 10, 'h');
    for (int i = 0; i < 4096 && RawServer::Send(fd, chunk); ++i) sent += chunk.size();
  });
  absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(PlainConfig(server.url()));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Json> v = (*c)->Get("/api");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("header is over 64 KiB"));
  EXPECT_LT(sent.load(), size_t{4096} * (64 << 10)) << "the client read the whole line";
}

// Header lines dripped slowly: the call's deadline covers the whole
// exchange, not each read. The server would finish a good answer after
// 20 lines at 300 ms; the call, with a 1 s deadline, ends before.
TEST(KubeClientLimitsTest, ADrippedAnswerEndsAtTheCallsDeadline) {
  RawServer server([](int fd) {
    if (!RawServer::Send(fd, "HTTP/1.1 200 OK\r\n")) return;
    for (int i = 0; i < 20; ++i) {
      absl::SleepFor(absl::Milliseconds(300));
      if (!RawServer::Send(fd, absl::StrCat("X-Drip-", i, ": x\r\n"))) return;
    }
    RawServer::Send(fd, "Content-Length: 2\r\n\r\n{}");
  });
  absl::StatusOr<std::unique_ptr<KubeClient>> c =
      KubeClient::Create(PlainConfig(server.url()), absl::Seconds(1));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Json> v = (*c)->Get("/api");
  ASSERT_FALSE(v.ok()) << "the whole dripped answer was waited for";
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("no whole answer within 1s"));
}

// A body over the limit is not read, whether the server gives its length,
// sends it in chunks, or sends until it closes.
TEST(KubeClientLimitsTest, ABodyOverTheLimitIsRefusedWhateverItsFraming) {
  const std::string piece(64 << 10, 'x');
  const std::vector<std::pair<std::string, std::function<void(int)>>> framings = {
      {"length",
       [&](int fd) {
         if (!RawServer::Send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 3145728\r\n\r\n")) return;
         for (int i = 0; i < 48 && RawServer::Send(fd, piece); ++i) {
         }
       }},
      {"chunked",
       [&](int fd) {
         if (!RawServer::Send(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")) {
           return;
         }
         for (int i = 0; i < 48 && RawServer::Send(fd, "10000\r\n" + piece + "\r\n"); ++i) {
         }
         RawServer::Send(fd, "0\r\n\r\n");
       }},
      {"until-close",
       [&](int fd) {
         if (!RawServer::Send(fd, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")) return;
         for (int i = 0; i < 48 && RawServer::Send(fd, piece); ++i) {
         }
       }},
  };
  for (const auto& [name, answer] : framings) {
    SCOPED_TRACE(name);
    RawServer server(answer);
    absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(PlainConfig(server.url()));
    ASSERT_TRUE(c.ok()) << c.status();
    (*c)->set_max_body_bytes(1 << 20);
    absl::StatusOr<Json> v = (*c)->Get("/apis");
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(v.status().message()), HasSubstr("over 1 MiB"));
  }
}

// A stopping dpproxy cancels its client: a call waiting on a server that
// answers slowly ends at once, and later calls fail without a connection.
TEST(KubeClientLimitsTest, CancelEndsACallInFlight) {
  absl::Notification first_line;
  absl::Notification done;
  RawServer server([&](int fd) {
    if (!RawServer::Send(fd, "HTTP/1.1 200 OK\r\n")) return;
    first_line.Notify();
    // Far longer than any test: held until the client goes, or the test ends.
    while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(200))) {
      if (!RawServer::Send(fd, "X-Wait: x\r\n")) return;
    }
  });
  absl::StatusOr<std::unique_ptr<KubeClient>> c =
      KubeClient::Create(PlainConfig(server.url()), absl::Minutes(10));
  ASSERT_TRUE(c.ok()) << c.status();
  std::thread cancel([&] {
    first_line.WaitForNotification();
    (*c)->Cancel();
  });
  absl::StatusOr<Json> v = (*c)->Get("/api");
  done.Notify();
  cancel.join();
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("dpproxy is stopping"));
  absl::StatusOr<Json> later = (*c)->Get("/api");
  EXPECT_THAT(std::string(later.status().message()), HasSubstr("dpproxy is stopping"));
}

TEST_F(KubeClientTest, ATokenFileIsReadAtEveryRequest) {
  FakeApiServer api(dir_.path());
  api.http().Get("/api", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{}", "application/json");
  });
  KubeConfig config = Config(api.url());
  config.token.clear();
  config.token_file = dir_.Sub("token");
  ASSERT_TRUE(WriteFileAtomic(config.token_file, "first\n").ok());
  absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(config);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Get("/api").ok());
  EXPECT_EQ(api.last_auth(), "Bearer first");
  ASSERT_TRUE(WriteFileAtomic(config.token_file, "rotated").ok());
  ASSERT_TRUE((*c)->Get("/api").ok());
  EXPECT_EQ(api.last_auth(), "Bearer rotated");
}

TEST_F(KubeClientTest, AServerTheCaDoesNotVouchForIsRefused) {
  FakeApiServer api(dir_.path());
  api.http().Get("/api", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{}", "application/json");
  });
  KubeConfig config = Config(api.url());
  config.ca_file = dir_.Sub("other.crt");
  absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(config);
  ASSERT_TRUE(c.ok());
  absl::StatusOr<Json> v = (*c)->Get("/api");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("GET /api"));
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("certificate"));
  // And https without any CA is refused before any request.
  config.ca_file.clear();
  absl::StatusOr<std::unique_ptr<KubeClient>> none = KubeClient::Create(config);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("no CA"));
}

TEST_F(KubeClientTest, KubernetesErrorsBecomeCodesWithTheServersReason) {
  FakeApiServer api(dir_.path());
  api.http().Get("/missing", [](const httplib::Request&, httplib::Response& res) {
    Status(res, 404, "NotFound", "resourceclaims \"gpu\" not found");
  });
  api.http().Get("/forbidden", [](const httplib::Request&, httplib::Response& res) {
    Status(res, 403, "Forbidden", "cannot get resource \"resourceclaims\"");
  });
  api.http().Put("/stale", [](const httplib::Request&, httplib::Response& res) {
    Status(res, 409, "Conflict", "the object has been modified");
  });
  api.http().Post("/exists", [](const httplib::Request&, httplib::Response& res) {
    Status(res, 409, "AlreadyExists", "resourceslices \"a\" already exists");
  });
  api.http().Get("/down", [](const httplib::Request&, httplib::Response& res) {
    res.status = 503;
  });
  absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(Config(api.url()));
  ASSERT_TRUE(c.ok());
  absl::StatusOr<Json> r = (*c)->Get("/missing");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("GET /missing: HTTP 404 NotFound: resourceclaims \"gpu\" not found"));
  EXPECT_EQ((*c)->Get("/forbidden").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*c)->Put("/stale", Json::object()).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*c)->Post("/exists", Json::object()).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ((*c)->Get("/down").status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(KubeClientTest, ClientCertificatesAuthenticateWhereTheServerAsks) {
  FakeApiServer api(dir_.path(), /*want_client_cert=*/true);
  api.http().Get("/api", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{}", "application/json");
  });
  KubeConfig config = Config(api.url());
  config.token.clear();
  absl::StatusOr<std::unique_ptr<KubeClient>> anonymous = KubeClient::Create(config);
  ASSERT_TRUE(anonymous.ok());
  EXPECT_FALSE((*anonymous)->Get("/api").ok());  // the handshake fails without one
  config.client_cert_data = *ReadFile(dir_.Sub("client.crt"));
  config.client_key_data = *ReadFile(dir_.Sub("client.key"));
  absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(config);
  ASSERT_TRUE(c.ok());
  absl::StatusOr<Json> v = (*c)->Get("/api");
  EXPECT_TRUE(v.ok()) << v.status();
  config.client_key_data.clear();
  EXPECT_THAT(std::string(KubeClient::Create(config).status().message()),
              HasSubstr("needs its key"));
}

// A kubeconfig gives CAs and client certificates as files or as PEM text:
// both work; a server address that cannot be one is refused by name.
TEST_F(KubeClientTest, CaAndClientCertificatesAsFilesOrTextAndBadAddresses) {
  FakeApiServer api(dir_.path(), /*want_client_cert=*/true);
  api.http().Get("/api", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{}", "application/json");
  });
  KubeConfig config = Config(api.url());
  config.ca_file.clear();
  config.ca_data = *ReadFile(dir_.Sub("server.crt"));
  config.client_cert_file = dir_.Sub("client.crt");
  config.client_key_file = dir_.Sub("client.key");
  absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(config);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Json> v = (*c)->Get("/api");
  EXPECT_TRUE(v.ok()) << v.status();
  config.ca_data = "not a certificate";
  EXPECT_THAT(std::string(KubeClient::Create(config).status().message()),
              HasSubstr("certificate-authority-data holds no PEM certificate"));
  for (const auto& [server, why] : std::vector<std::pair<std::string, std::string>>{
           {"ftp://a:1", "is not an http(s) URL"},
           {"https://a:99999", "not a number from 1 to 65535"},
           {"https://a:x", "not a number from 1 to 65535"},
           {"https://:443", "has no host"},
           {"https://[::1:443", "no ]"}}) {
    KubeConfig bad = Config(server);
    EXPECT_THAT(std::string(KubeClient::Create(bad).status().message()), HasSubstr(why))
        << server;
  }
  // An IPv6 address with a port is one.
  EXPECT_TRUE(KubeClient::Create(Config("https://[::1]:6443")).ok());
}

TEST_F(KubeClientTest, AKubeconfigFindsServerCaAndUser) {
  FakeApiServer api(dir_.path());
  api.http().Get("/api", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{}", "application/json");
  });
  const std::string ca = absl::Base64Escape(*ReadFile(dir_.Sub("server.crt")));
  const std::string kubeconfig = absl::StrCat(R"(apiVersion: v1
kind: Config
current-context: node
contexts:
- name: node
  context: {cluster: local, user: agent}
- name: relative
  context: {cluster: by-file, user: agent}
- name: plugin
  context: {cluster: local, user: sso}
clusters:
- name: local
  cluster:
    server: )", api.url(), R"(/
    certificate-authority-data: )", ca, R"(
- name: by-file
  cluster:
    server: )", api.url(), R"(
    certificate-authority: server.crt
users:
- name: agent
  user: {token: from-kubeconfig}
- name: sso
  user:
    exec: {command: get-token}
)");
  const std::string path = dir_.Sub("kubeconfig");
  ASSERT_TRUE(WriteFileAtomic(path, kubeconfig).ok());
  absl::StatusOr<KubeConfig> config = LoadKubeconfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, api.url());  // the trailing slash dropped
  absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(*config);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Get("/api").ok());
  EXPECT_EQ(api.last_auth(), "Bearer from-kubeconfig");
  // A relative CA path is relative to the kubeconfig's directory.
  absl::StatusOr<KubeConfig> relative = LoadKubeconfig(path, "relative");
  ASSERT_TRUE(relative.ok()) << relative.status();
  EXPECT_EQ(relative->ca_file, dir_.Sub("server.crt"));
  EXPECT_TRUE((*KubeClient::Create(*relative))->Get("/api").ok());
  // What dpproxy cannot use is named.
  EXPECT_THAT(std::string(LoadKubeconfig(path, "plugin").status().message()),
              HasSubstr("exec or auth-provider"));
  EXPECT_THAT(std::string(LoadKubeconfig(path, "nope").status().message()),
              HasSubstr("no context \"nope\""));
  EXPECT_THAT(std::string(LoadKubeconfig(dir_.Sub("absent")).status().message()),
              HasSubstr("absent"));
}

TEST_F(KubeClientTest, InClusterUsesTheServiceAccountAndTheServiceAddress) {
  const std::string sa = dir_.Sub("sa");
  ASSERT_TRUE(MakeDirs(sa).ok());
  auto env = [](const char* name) -> const char* {
    if (std::string(name) == "KUBERNETES_SERVICE_HOST") return "10.96.0.1";
    if (std::string(name) == "KUBERNETES_SERVICE_PORT") return "443";
    return nullptr;
  };
  // No token mounted: named.
  absl::StatusOr<KubeConfig> c = InClusterConfig(env, sa);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("token"));
  ASSERT_TRUE(WriteFileAtomic(sa + "/token", "t").ok());
  ASSERT_TRUE(WriteFileAtomic(sa + "/ca.crt", *ReadFile(dir_.Sub("server.crt"))).ok());
  ASSERT_TRUE(WriteFileAtomic(sa + "/namespace", "kube-system\n").ok());
  c = InClusterConfig(env, sa);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, "https://10.96.0.1:443");
  EXPECT_EQ(c->token_file, sa + "/token");
  EXPECT_EQ(c->ca_file, sa + "/ca.crt");
  EXPECT_EQ(c->namespace_, "kube-system");
  auto v6 = [](const char* name) -> const char* {
    if (std::string(name) == "KUBERNETES_SERVICE_HOST") return "fd00::1";
    if (std::string(name) == "KUBERNETES_SERVICE_PORT") return "443";
    return nullptr;
  };
  EXPECT_EQ(InClusterConfig(v6, sa)->server, "https://[fd00::1]:443");
  auto outside = [](const char*) -> const char* { return nullptr; };
  EXPECT_THAT(std::string(InClusterConfig(outside, sa).status().message()),
              HasSubstr("not in a pod"));
}

}  // namespace
}  // namespace dpproxy
