// Crash safety: dpproxy, a real process, is killed with SIGKILL at random
// moments during a stream of allocations. After every kill the state (the
// snapshot and the journal) must be intact and hold every allocation the
// client received an answer for, with its response. 20 kills by default; DPP_CRASH_ITERATIONS=N for a longer run.
#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <algorithm>
#include <map>
#include <random>
#include <thread>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/util/files.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/state/allocation_response.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/state_dir.h"
#include "proxy/state/state_store.h"
#include "tests/testing/file_wait.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using testing::Kill;
using testing::Runfile;
using testing::Spawn;

// dpproxy's event for each device list it takes from a plugin.
constexpr char kDevicesTaken[] = "\"event\":\"devices\"";

// How many device lists an events file says were taken (dpproxy appends
// them across its runs; a SIGKILL may tear the last line only).
int CountListsTaken(const std::string& text) {
  int n = 0;
  for (size_t at = text.find(kDevicesTaken); at != std::string::npos;
       at = text.find(kDevicesTaken, at + 1)) {
    ++n;
  }
  return n;
}
int ListsTaken(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  return text.ok() ? CountListsTaken(*text) : 0;
}

TEST(CrashTest, EveryAnsweredAllocationSurvivesSigkill) {
  int iterations = 20;
  if (const char* env = std::getenv("DPP_CRASH_ITERATIONS")) iterations = std::atoi(env);
  testing::ShortTempDir dir;
  const std::string kubelet_root = dir.Sub("k");
  const std::string plugins = dir.Sub("p");
  const std::string state_dir = dir.Sub("s");
  ASSERT_TRUE(MakeDirs(kubelet_root + "/device-plugins").ok());
  const std::string proxied = kubelet_root + "/device-plugins/dpproxy-vendor.com_gpu.sock";

  const char* trace = std::getenv("DPP_CRASH_TRACE");  // a directory for event files
  const std::string events =
      trace != nullptr ? absl::StrCat(trace, "/proxy.jsonl") : dir.Sub("proxy.jsonl");
  std::vector<std::string> plugin_args = {Runfile("tools/sample_plugin/sample_plugin"),
                                          "--resource=vendor.com/gpu", "--devices=4",
                                          "--kubelet_socket=" + plugins + "/kubelet.sock",
                                          "--quiet"};
  if (trace != nullptr) plugin_args.push_back(absl::StrCat("--events=", trace, "/plugin.jsonl"));
  std::unique_ptr<ChildProcess> plugin = Spawn(plugin_args);
  std::mt19937 rng(12345);
  std::map<std::string, int> answered;  // device -> allocations answered OK
  int total_answered = 0, kills = 0;
  absl::Duration recovery_total, recovery_max;
  for (int round = 0; round < iterations; ++round) {
    std::vector<std::string> proxy_args = {Runfile("proxy/dpproxy"),
                                           "--kubelet_root=" + kubelet_root,
                                           "--plugin_dir=" + plugins, "--state_dir=" + state_dir,
                                           "--status_file=", "--metrics_address=",
                                           trace != nullptr ? "--minloglevel=0" : "--minloglevel=2"};
    proxy_args.push_back("--events=" + events);
    const int lists_before = ListsTaken(events);
    std::unique_ptr<ChildProcess> proxy = Spawn(proxy_args);
    auto stub = v1beta1::DevicePlugin::NewStub(MakeUnixChannel(proxied));
    auto fresh = [&] { stub = v1beta1::DevicePlugin::NewStub(MakeUnixChannel(proxied)); };
    // `first`: the kubelet-facing socket may appear a moment later; the
    // call waits for it (gRPC's wait_for_ready).
    std::string last_call;  // how the last Allocate ended, for failure messages
    auto allocate = [&](const std::string& id, bool first = false) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(first ? 15 : 2)));
      ctx.set_wait_for_ready(first);
      v1beta1::AllocateRequest req;
      req.add_container_requests()->add_devices_ids(id);
      v1beta1::AllocateResponse resp;
      grpc::Status s = stub->Allocate(&ctx, req, &resp);
      last_call = s.ok() ? "OK" : DescribeGrpcStatus(s);
      if (trace != nullptr && !s.ok()) {
        std::cout << absl::FormatTime("%H:%M:%E3S ", absl::Now(), absl::UTCTimeZone())
                  << last_call << "\n";
      }
      return s.ok() && resp.container_responses_size() == 1 &&
             resp.container_responses(0).envs().at("SAMPLE_GPU_DEVICES") == id;
    };
    // Allocations go through once the plugin is back and dpproxy has its
    // device list (as a kubelet allocates only devices it was shown; on a
    // first start dpproxy knows no device before that list); the
    // kubelet-facing socket follows at once.
    const absl::Time spawned = absl::Now();
    ASSERT_TRUE(testing::WaitForFile(
        events, [&](const std::string& text) { return CountListsTaken(text) > lists_before; },
        absl::Seconds(15)))
        << "round " << round << ": the plugin's device list never came back to dpproxy";
    fresh();
    ASSERT_TRUE(allocate("dev-0", /*first=*/true))
        << "round " << round << ": an allocation after the device list failed (" << last_call
        << ")";
    ++answered["dev-0"];
    ++total_answered;
    const absl::Duration recovery = absl::Now() - spawned;
    recovery_total += recovery;
    recovery_max = std::max(recovery_max, recovery);

    // A stream of allocations; SIGKILL at a random moment during it.
    std::atomic<bool> stop{false};
    std::map<std::string, int> this_round;
    std::thread client([&] {
      for (int n = 0; !stop; ++n) {
        std::string id = absl::StrCat("dev-", n % 4);
        if (allocate(id)) ++this_round[id];
      }
    });
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(10, 150)(rng)));
    Kill(proxy.get(), SIGKILL);
    ++kills;
    stop = true;
    client.join();
    for (const auto& [id, n] : this_round) {
      answered[id] += n;
      total_answered += n;
    }

    // The file is intact and holds every answered allocation with its
    // response (the kill leaves the page cache: answers written but not
    // yet synced survive it). An allocation the kill interrupted may be
    // there as a reservation without a response; it is not counted.
    absl::StatusOr<state::State> st = ReadStateDir(state_dir);
    ASSERT_TRUE(st.ok()) << "round " << round << ": " << st.status();
    std::map<std::string, int> journaled;
    for (const auto& a : st->allocations()) {
      if (a.device_ids_size() != 1) continue;
      const v1beta1::ContainerAllocateResponse r = ResponseOf(a);
      auto env = r.envs().find("SAMPLE_GPU_DEVICES");
      if (env != r.envs().end() && env->second == a.device_ids(0)) {
        ++journaled[a.device_ids(0)];
      }
    }
    for (const auto& [id, n] : answered) {
      EXPECT_GE(journaled[id], n) << "round " << round << ": device " << id
                                  << " answered " << n << " times, journaled " << journaled[id];
    }
  }
  Kill(plugin.get(), SIGTERM);
  std::cout << kills << " SIGKILLs, " << total_answered
            << " allocations answered, all of them in the state file; time from dpproxy start "
               "to the first answered allocation: mean "
            << absl::FormatDuration(recovery_total / std::max(1, kills)) << ", max "
            << absl::FormatDuration(recovery_max) << "\n";
  EXPECT_EQ(kills, iterations);
  EXPECT_GT(total_answered, iterations);  // the stream really ran
}

}  // namespace
}  // namespace dpproxy
