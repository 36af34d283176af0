// The apiserver_sim binary as a user runs it: started with flags, it prints
// where it serves; claims are created and allocated through the API as the
// scheduler does; bad flags exit 2 naming the flag.
#include <fstream>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/kube/kube_client.h"
#include "proxy/util/child_process.h"
#include "proxy/util/files.h"
#include "tests/testing/process.h"
#include "tests/testing/file_wait.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

TEST(ApiServerSimBinaryTest, ServesClaimsTheWayTheSchedulerWritesThem) {
  testing::ShortTempDir dir;
  ChildSpec spec;
  spec.argv = {testing::Runfile("tools/apiserver_sim/apiserver_sim"), "--listen=127.0.0.1:0",
               "--token=t", "--versions=v1,v1beta1", "--nodes=node-1=v1.33.4",
               "--events=" + dir.Sub("events.jsonl")};
  spec.output_path = dir.Sub("out.log");
  absl::StatusOr<std::unique_ptr<ChildProcess>> p = ChildProcess::Start(spec);
  ASSERT_TRUE(p.ok()) << p.status();
  // It prints its URL once it listens.
  std::string url;
  EXPECT_TRUE(testing::WaitForFile(
      spec.output_path,
      [&](const std::string& out) {
        const size_t at = out.find("serving ");
        if (at == std::string::npos || out.find('\n', at) == std::string::npos) return false;
        url = out.substr(at + 8, out.find('\n', at) - at - 8);
        return true;
      },
      absl::Seconds(10)));
  ASSERT_TRUE(absl::StartsWith(url, "http://127.0.0.1:")) << url;
  KubeConfig c;
  c.server = url;
  c.token = "t";
  std::unique_ptr<KubeClient> client = *KubeClient::Create(c);
  absl::StatusOr<Json> group = client->Get("/apis/resource.k8s.io");
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)["preferredVersion"]["version"], "v1");
  // The nodes given answer their kubelet's version; others are not found.
  absl::StatusOr<Json> node = client->Get("/api/v1/nodes/node-1");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ((*node)["status"]["nodeInfo"]["kubeletVersion"], "v1.33.4");
  EXPECT_EQ(client->Get("/api/v1/nodes/node-2").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<Json> made = client->Post(
      "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
      {{"metadata", {{"name", "gpu"}}}, {"spec", Json::object()}});
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_FALSE((*made)["metadata"]["uid"].get<std::string>().empty());
  Json allocated = *made;
  allocated["status"] = {{"allocation",
                          {{"devices",
                            {{"results",
                              {{{"request", "gpu"}, {"driver", "gpu.vendor.com"},
                                {"pool", "node-1/vendor.com-gpu"}, {"device", "gpu-0"}}}}}}}}};
  ASSERT_TRUE(client->Put("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu/status",
                          allocated)
                  .ok());
  // A second write from the stale copy is a conflict, as in Kubernetes.
  EXPECT_EQ(client->Put("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu/status",
                        allocated)
                .status()
                .code(),
            absl::StatusCode::kAborted);
  absl::StatusOr<Json> got =
      client->Get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)["status"]["allocation"]["devices"]["results"][0]["device"], "gpu-0");
  EXPECT_EQ(client->Post("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
                         {{"metadata", {{"name", "gpu"}}}})
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);
  // `apiserver_sim claim` plays the scheduler: created and allocated.
  ChildSpec claim;
  claim.argv = {testing::Runfile("tools/apiserver_sim/apiserver_sim"), "claim", "--server=" + url,
                "--token=t", "--name=train", "--driver=gpu.vendor.com",
                "--pool=node-1/vendor.com-gpu", "--devices=gpu-1,gpu-2"};
  claim.output_path = dir.Sub("claim.log");
  absl::StatusOr<std::unique_ptr<ChildProcess>> cp = ChildProcess::Start(claim);
  ASSERT_TRUE(cp.ok());
  std::optional<int> status = (*cp)->Wait(absl::Seconds(20));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 0) << *ReadFile(claim.output_path);
  absl::StatusOr<Json> train =
      client->Get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/train");
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(*ReadFile(claim.output_path),
            "default/train/" + (*train)["metadata"]["uid"].get<std::string>() + "\n");
  const Json& results = (*train)["status"]["allocation"]["devices"]["results"];
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[1], Json({{"request", "gpu"}, {"driver", "gpu.vendor.com"},
                              {"pool", "node-1/vendor.com-gpu"}, {"device", "gpu-2"}}));
  // --count picks from the published slices, skipping devices taken.
  ASSERT_TRUE(client->Post("/apis/resource.k8s.io/v1/resourceslices",
                           {{"metadata", {{"name", "s"}}},
                            {"spec",
                             {{"driver", "gpu.vendor.com"},
                              {"nodeName", "node-1"},
                              {"pool", {{"name", "node-1/vendor.com-gpu"},
                                        {"generation", 1},
                                        {"resourceSliceCount", 1}}},
                              {"devices", {{{"name", "gpu-0"}}, {{"name", "gpu-1"}},
                                           {{"name", "gpu-2"}}, {{"name", "gpu-3"}}}}}}})
                  .ok());
  ChildSpec pick;
  pick.argv = {testing::Runfile("tools/apiserver_sim/apiserver_sim"), "claim", "--server=" + url,
               "--token=t", "--name=infer", "--driver=gpu.vendor.com", "--count=1"};
  pick.output_path = dir.Sub("pick.log");
  cp = ChildProcess::Start(pick);
  ASSERT_TRUE(cp.ok());
  status = (*cp)->Wait(absl::Seconds(20));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 0) << *ReadFile(pick.output_path);
  absl::StatusOr<Json> infer =
      client->Get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/infer");
  ASSERT_TRUE(infer.ok()) << infer.status();
  // gpu-0 (the claim "gpu") and gpu-1, gpu-2 ("train") are taken.
  EXPECT_EQ((*infer)["status"]["allocation"]["devices"]["results"][0]["device"], "gpu-3");
  EXPECT_EQ((*p)->Stop(absl::Seconds(10)), 0);  // SIGTERM: a clean exit
  EXPECT_THAT(*ReadFile(dir.Sub("events.jsonl")), HasSubstr("\"event\":\"request\""));
}

TEST(ApiServerSimBinaryTest, HelpListsItsOwnFlagsOnly) {
  testing::ShortTempDir dir;
  ChildSpec spec;
  spec.argv = {testing::Runfile("tools/apiserver_sim/apiserver_sim"), "--help"};
  spec.output_path = dir.Sub("help.log");
  absl::StatusOr<std::unique_ptr<ChildProcess>> p = ChildProcess::Start(spec);
  ASSERT_TRUE(p.ok());
  std::optional<int> status = (*p)->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  const std::string help = *ReadFile(spec.output_path);
  for (const char* flag : {"--listen", "--token", "--versions", "--server", "--devices"}) {
    EXPECT_THAT(help, HasSubstr(flag)) << flag;
  }
  EXPECT_THAT(help, ::testing::Not(HasSubstr("logtostderr")));  // not glog's
}

TEST(ApiServerSimBinaryTest, BadFlagsExitTwoNamingTheFlag) {
  testing::ShortTempDir dir;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--listen=nowhere"}, {"--versions=v1alpha3"},
        {"--listen=127.0.0.1:x"}, {"--nodes=node-1"}}) {
    ChildSpec spec;
    spec.argv = {testing::Runfile("tools/apiserver_sim/apiserver_sim")};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.output_path = dir.Sub("bad.log");
    absl::StatusOr<std::unique_ptr<ChildProcess>> p = ChildProcess::Start(spec);
    ASSERT_TRUE(p.ok());
    std::optional<int> status = (*p)->Wait(absl::Seconds(10));
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(WEXITSTATUS(*status), 2) << args[0];
    EXPECT_THAT(*ReadFile(spec.output_path), HasSubstr(args[0].substr(2, args[0].find('=') - 2)));
  }
}

}  // namespace
}  // namespace dpproxy
