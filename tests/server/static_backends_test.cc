// StaticBackends, the backends dpproxy dials itself: what a reload's
// removals and renames leave dialled, and a dial that fails, on real
// workers against a socket path where nothing listens.
#include "proxy/server/static_backends.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/core/resource.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(20);

StaticBackendConfig Nic(const std::string& endpoint) {
  StaticBackendConfig c;
  c.resource = "example.com/nic";
  c.endpoint = endpoint;
  c.api = ApiVersion::kV1Beta1;
  return c;
}

class StaticBackendsTest : public ::testing::Test {
 protected:
  // One worker: a job submitted after a tick's dial runs after it ended.
  void DrainWorker() {
    absl::Notification done;
    ASSERT_TRUE(workers_.Submit([&done] { done.Notify(); }));
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(kWait));
  }

  testing::ShortTempDir dir_;
  EventLog events_{"test"};
  WorkQueue workers_{1};
  int attached_ = 0;
  StaticBackends statics_{{1 << 20}, &workers_, &events_, [this](std::shared_ptr<Backend>) {
                            ++attached_;
                            return absl::OkStatus();
                          }};
};

TEST_F(StaticBackendsTest, AReloadRemovesOnlyTheEndpointItNames) {
  statics_.Dial("example.com/nic", Nic("/run/a.sock"));
  EXPECT_FALSE(statics_.Remove("example.com/nic", Nic("/run/other.sock")));
  EXPECT_TRUE(statics_.dialled("example.com/nic"));
  EXPECT_TRUE(statics_.Remove("example.com/nic", Nic("/run/a.sock")));
  const StaticBackends::Report r = statics_.report("example.com/nic");
  EXPECT_FALSE(r.dialled);
  EXPECT_TRUE(r.removed);
  EXPECT_EQ(statics_.removed(), std::set<std::string>{"example.com/nic"});
  // A plugin registering for the name serves it again.
  statics_.PluginServes("example.com/nic");
  EXPECT_FALSE(statics_.report("example.com/nic").removed);
  EXPECT_TRUE(statics_.removed().empty());
}

TEST_F(StaticBackendsTest, ARenameMovesTheDialToTheNewName) {
  statics_.Dial("example.com/nic", Nic("/run/a.sock"));
  EXPECT_TRUE(statics_.Move("example.com/nic", "example.com/net"));
  EXPECT_FALSE(statics_.dialled("example.com/nic"));
  EXPECT_TRUE(statics_.dialled("example.com/net"));
  EXPECT_FALSE(statics_.report("example.com/nic").removed);  // not removed: renamed
  // Nothing dialled under the old name any more: a second move is refused.
  EXPECT_FALSE(statics_.Move("example.com/nic", "example.com/other"));
  EXPECT_FALSE(statics_.dialled("example.com/other"));
}

TEST_F(StaticBackendsTest, AFailingDialIsCountedAndReportedOnce) {
  const std::string endpoint = JoinPath(dir_.path(), "nobody.sock");
  statics_.Dial("example.com/nic", Nic(endpoint));
  ServedResource served;
  served.resource = std::make_unique<Resource>("example.com/nic", ResourcePolicy(), &events_,
                                               ResourceHooks());
  std::string before;
  statics_.AppendFingerprint(&before);
  for (int i = 0; i < 3; ++i) {
    statics_.Tick({&served});
    DrainWorker();
  }
  const StaticBackends::Report r = statics_.report("example.com/nic");
  EXPECT_TRUE(r.dialled);
  EXPECT_EQ(r.failures, 3);
  EXPECT_THAT(r.error, HasSubstr(endpoint));
  EXPECT_THAT(r.error, HasSubstr("nobody listens"));
  EXPECT_EQ(attached_, 0);
  // One event for the run of failures, not one per dial.
  int events = 0;
  for (const Json& e : events_.Snapshot()) events += e["event"] == "static_backend_unreachable";
  EXPECT_EQ(events, 1);
  // The status changes with the failure, not with its count.
  std::string failing, still_failing;
  statics_.AppendFingerprint(&failing);
  EXPECT_NE(before, failing);
  statics_.Tick({&served});
  DrainWorker();
  statics_.AppendFingerprint(&still_failing);
  EXPECT_EQ(failing, still_failing);
  EXPECT_EQ(statics_.report("example.com/nic").failures, 4);
}

TEST_F(StaticBackendsTest, ARemovedBackendIsNotDialled) {
  statics_.Dial("example.com/nic", Nic(JoinPath(dir_.path(), "nobody.sock")));
  ASSERT_TRUE(statics_.Remove("example.com/nic", Nic(JoinPath(dir_.path(), "nobody.sock"))));
  ServedResource served;
  served.resource = std::make_unique<Resource>("example.com/nic", ResourcePolicy(), &events_,
                                               ResourceHooks());
  statics_.Tick({&served});
  DrainWorker();
  EXPECT_EQ(statics_.report("example.com/nic").failures, 0);
}

// A socket file left by a plugin that is gone (nobody listens on it) is
// refused before any gRPC dial, naming the problem: a dial would hold the
// worker in gRPC's wait for a connection, polling for the whole process.
TEST_F(StaticBackendsTest, AStaleSocketIsRefusedBeforeAnyDial) {
  const std::string endpoint = JoinPath(dir_.path(), "stale.sock");
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(endpoint.size(), sizeof(addr.sun_path));
  memcpy(addr.sun_path, endpoint.c_str(), endpoint.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);  // the file stays; nothing listens
  statics_.Dial("example.com/nic", Nic(endpoint));
  ServedResource served;
  served.resource = std::make_unique<Resource>("example.com/nic", ResourcePolicy(), &events_,
                                               ResourceHooks());
  statics_.Tick({&served});
  DrainWorker();
  const StaticBackends::Report r = statics_.report("example.com/nic");
  EXPECT_EQ(r.failures, 1);
  EXPECT_THAT(r.error, HasSubstr("nobody listens on " + endpoint));
  EXPECT_EQ(attached_, 0);
}

}  // namespace
}  // namespace dpproxy
