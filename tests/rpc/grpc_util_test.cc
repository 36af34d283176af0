#include "proxy/rpc/grpc_util.h"

#include <memory>
#include <string>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server_builder.h>

#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

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
// dial ends at its deadline, having tried fresh channels meanwhile.
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

TEST(DialUnixChannelTest, StopsWhenCancelled) {
  testing::ShortTempDir dir;
  int asked = 0;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> c =
      DialUnixChannel(dir.Sub("missing.sock"), absl::Seconds(60), [&] { return ++asked > 2; });
  EXPECT_EQ(c.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(asked, 3);  // asked before each fresh channel, and no more
}

}  // namespace
}  // namespace dpproxy
