// SlicePublisher against the API-server simulator over real HTTP: pools
// written whole with a bumped generation only when they change, slices
// removed when a pool shrinks, a wiped node re-published, the served
// version discovered, and nothing of other nodes or drivers touched.
#include "proxy/kubelet_side/dra/slice_publisher.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/apiserver_sim/apiserver_sim.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

std::vector<SliceDevice> Gpus(int n) {
  std::vector<SliceDevice> out;
  for (int i = 0; i < n; ++i) out.push_back({absl::StrCat("GPU-", i), true, {i % 2}});
  return out;
}

struct ApiFixture {
  explicit ApiFixture(std::vector<std::string> versions = {"v1", "v1beta1"})
      : api(sim::ApiServerSim::Options{"", "", "secret", std::move(versions)}) {
    EXPECT_TRUE(api.Start().ok());
    KubeConfig c;
    c.server = api.url();
    c.token = "secret";
    client = *KubeClient::Create(c);
  }
  // The pool's slices in the server: generation -> count of slices.
  std::map<int64_t, int> Generations(const std::string& node = "node-1") {
    std::map<int64_t, int> out;
    for (const auto& [name, s] : api.Slices()) {
      if (s["spec"]["nodeName"] == node) ++out[s["spec"]["pool"]["generation"].get<int64_t>()];
    }
    return out;
  }
  int Devices() {
    int n = 0;
    for (const auto& [name, s] : api.Slices()) n += static_cast<int>(s["spec"]["devices"].size());
    return n;
  }
  sim::ApiServerSim api;
  std::unique_ptr<KubeClient> client;
};

TEST(SlicePublisherTest, PoolsAreWrittenWholeAndOnlyWhenTheyChange) {
  ApiFixture s;
  SlicePublisher p(s.client.get(), "gpu.vendor.com", "node-1");
  ASSERT_TRUE(p.Publish("vendor.com/gpu", Gpus(300)).ok());
  EXPECT_EQ(p.api_version(), "resource.k8s.io/v1");  // the newest served
  EXPECT_EQ(s.Generations(), (std::map<int64_t, int>{{1, 3}}));
  EXPECT_EQ(s.Devices(), 300);
  const int writes = p.writes();
  // Published again unchanged: not one write.
  ASSERT_TRUE(p.Publish("vendor.com/gpu", Gpus(300)).ok());
  EXPECT_EQ(p.writes(), writes);
  EXPECT_EQ(s.Generations(), (std::map<int64_t, int>{{1, 3}}));
  // One device unhealthy: the pool again, every slice at generation 2.
  std::vector<SliceDevice> one_down = Gpus(300);
  one_down[5].healthy = false;
  ASSERT_TRUE(p.Publish("vendor.com/gpu", one_down).ok());
  EXPECT_EQ(s.Generations(), (std::map<int64_t, int>{{2, 3}}));
  EXPECT_EQ(s.Devices(), 299);
  // Shrunk to one slice: the others are deleted.
  ASSERT_TRUE(p.Publish("vendor.com/gpu", Gpus(10)).ok());
  EXPECT_EQ(s.Generations(), (std::map<int64_t, int>{{3, 1}}));
  EXPECT_EQ(s.Devices(), 10);
}

TEST(SlicePublisherTest, AKubeletStartWipingTheNodesSlicesIsRepaired) {
  ApiFixture s;
  SlicePublisher p(s.client.get(), "gpu.vendor.com", "node-1");
  ASSERT_TRUE(p.Publish("vendor.com/gpu", Gpus(4)).ok());
  EXPECT_EQ(s.api.DeleteSlicesOfNode("node-1"), 1);
  ASSERT_TRUE(p.Publish("vendor.com/gpu", Gpus(4)).ok());
  EXPECT_EQ(s.Devices(), 4);
  EXPECT_EQ(s.Generations(), (std::map<int64_t, int>{{1, 1}}));
}

TEST(SlicePublisherTest, OtherNodesDriversAndResourcesAreLeftAlone) {
  ApiFixture s;
  SlicePublisher gpus(s.client.get(), "gpu.vendor.com", "node-1");
  SlicePublisher other_node(s.client.get(), "gpu.vendor.com", "node-2");
  SlicePublisher other_driver(s.client.get(), "nic.vendor.com", "node-1");
  ASSERT_TRUE(gpus.Publish("vendor.com/gpu", Gpus(4)).ok());
  ASSERT_TRUE(gpus.Publish("vendor.com/fpga", Gpus(2)).ok());
  ASSERT_TRUE(other_node.Publish("vendor.com/gpu", Gpus(4)).ok());
  ASSERT_TRUE(other_driver.Publish("vendor.com/nic", Gpus(3)).ok());
  EXPECT_EQ(s.Devices(), 13);
  ASSERT_TRUE(gpus.Unpublish("vendor.com/gpu").ok());
  EXPECT_EQ(s.Devices(), 9);
  EXPECT_EQ(s.Generations("node-2"), (std::map<int64_t, int>{{1, 1}}));
}

TEST(SlicePublisherTest, TheServedVersionIsDiscoveredAndAnUnknownOneNamed) {
  ApiFixture beta({"v1beta1"});
  SlicePublisher p(beta.client.get(), "gpu.vendor.com", "node-1");
  ASSERT_TRUE(p.Publish("vendor.com/gpu", Gpus(2)).ok());
  EXPECT_EQ(p.api_version(), "resource.k8s.io/v1beta1");
  const Json slice = beta.api.Slices().begin()->second;
  EXPECT_EQ(slice["apiVersion"], "resource.k8s.io/v1beta1");
  EXPECT_TRUE(slice["spec"]["devices"][0].contains("basic"));  // accepted: the layout of v1beta1

  ApiFixture old({"v1alpha3"});
  SlicePublisher q(old.client.get(), "gpu.vendor.com", "node-1");
  absl::Status s = q.Publish("vendor.com/gpu", Gpus(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("serves resource.k8s.io v1alpha3"));
}

TEST(SlicePublisherTest, ConflictsAreRetriedAndAServerThatFailsLosesNothing) {
  ApiFixture s;
  SlicePublisher p(s.client.get(), "gpu.vendor.com", "node-1");
  ASSERT_TRUE(p.Publish("vendor.com/gpu", Gpus(4)).ok());
  // Someone wrote in between, twice: each 409 is retried from a fresh list.
  s.api.InjectFault({"PUT", "/apis/resource.k8s.io/v1/resourceslices/", 409, 2});
  std::vector<SliceDevice> three = Gpus(4);
  three[3].healthy = false;
  ASSERT_TRUE(p.Publish("vendor.com/gpu", three).ok());
  EXPECT_EQ(s.Devices(), 3);
  EXPECT_EQ(s.Generations(), (std::map<int64_t, int>{{2, 1}}));
  // A failing server: the publish fails naming it, and writes nothing.
  s.api.InjectFault({"", "/apis/", 503, 1});
  absl::Status failed = p.Publish("vendor.com/gpu", Gpus(4));
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(failed.message()), HasSubstr("unable to handle the request"));
  EXPECT_EQ(s.Devices(), 3);
  // Gone altogether, then back on its address: the next publish lands.
  s.api.Stop();
  EXPECT_EQ(p.Publish("vendor.com/gpu", Gpus(4)).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(s.api.Start().ok());
  ASSERT_TRUE(p.Publish("vendor.com/gpu", Gpus(4)).ok());
  EXPECT_EQ(s.Devices(), 4);
  EXPECT_EQ(s.Generations(), (std::map<int64_t, int>{{3, 1}}));
}

TEST(SlicePublisherTest, AServerNotYetAnsweringIsDiscoveredOnceItDoes) {
  ApiFixture s;
  s.api.Stop();
  SlicePublisher p(s.client.get(), "gpu.vendor.com", "node-1");
  EXPECT_EQ(p.Version().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(p.api_version(), "");
  ASSERT_TRUE(s.api.Start().ok());
  absl::StatusOr<std::string> v = p.Version();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "resource.k8s.io/v1");
  EXPECT_EQ(p.api_version(), "resource.k8s.io/v1");
}

TEST(SlicePublisherTest, TheSimulatorRefusesWhatTheApiServerWould) {
  ApiFixture s;
  Json slice = {{"metadata", {{"name", "x"}}},
                {"spec",
                 {{"driver", "gpu.vendor.com"},
                  {"nodeName", "node-1"},
                  {"pool", {{"name", "p"}, {"generation", 1}, {"resourceSliceCount", 1}}},
                  {"devices", {{{"name", "GPU-0"}}}}}}};
  absl::StatusOr<Json> r = s.client->Post("/apis/resource.k8s.io/v1/resourceslices", slice);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("RFC 1123 label"));
  slice["spec"]["devices"][0]["name"] = "gpu-0";
  ASSERT_TRUE(s.client->Post("/apis/resource.k8s.io/v1/resourceslices", slice).ok());
  EXPECT_EQ(s.client->Post("/apis/resource.k8s.io/v1/resourceslices", slice).status().code(),
            absl::StatusCode::kAlreadyExists);
  slice["metadata"]["resourceVersion"] = "1";  // stale
  EXPECT_EQ(s.client->Put("/apis/resource.k8s.io/v1/resourceslices/x", slice).status().code(),
            absl::StatusCode::kAborted);
  KubeConfig wrong;
  wrong.server = s.api.url();
  wrong.token = "guess";
  EXPECT_EQ((*KubeClient::Create(wrong))->Get("/apis/resource.k8s.io").status().code(),
            absl::StatusCode::kUnauthenticated);
}

// Answers of the wrong shape fail their call, naming the field, and never
// end the process (the JSON library's type errors are exceptions); the same
// publisher then works against a sane answer.
TEST(SlicePublisherTest, AnswersOfTheWrongTypesFailTheCallNamingTheField) {
  ApiFixture f;
  SlicePublisher p(f.client.get(), "gpu.vendor.com", "node-1");
  f.api.InjectAnswer("GET", "/apis/resource.k8s.io", 200, R"({"versions": [{"version": 1}]})");
  absl::Status s = p.Discover();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("versions[0].version is an integer, not a string"));
  ASSERT_TRUE(p.Discover().ok());
  const std::string slices = "/apis/resource.k8s.io/v1/resourceslices";
  f.api.InjectAnswer("GET", slices, 200,
                     R"({"items": [{"metadata": {"name": "x"},)"
                     R"( "spec": {"pool": {"generation": "7"}}}]})");
  s = p.Publish("vendor.com/gpu", Gpus(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("items[0].spec.pool.generation is a string, not an integer"));
  f.api.InjectAnswer("GET", slices, 200, R"({"items": 3})");
  EXPECT_THAT(p.Publish("vendor.com/gpu", Gpus(2)).message(),
              HasSubstr("items is an integer, not an array"));
  f.api.InjectAnswer("GET", slices, 200, R"([1, 2])");
  EXPECT_THAT(p.Publish("vendor.com/gpu", Gpus(2)).message(),
              HasSubstr("the answer is an array, not an object"));
  EXPECT_TRUE(p.Publish("vendor.com/gpu", Gpus(2)).ok());
}

// An answer over the limit is not read into memory: the call fails, named.
TEST(SlicePublisherTest, AnAnswerOverTheLimitFailsTheCall) {
  ApiFixture f;
  f.client->set_max_body_bytes(1 << 20);
  SlicePublisher p(f.client.get(), "gpu.vendor.com", "node-1");
  std::string huge = R"({"kind": "APIGroup", "padding": ")";
  huge.append(3 << 20, 'x');
  huge += R"("})";
  f.api.InjectAnswer("GET", "/apis/resource.k8s.io", 200, huge);
  absl::Status s = p.Discover();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("the API server's answer is over 1 MiB"));
  EXPECT_TRUE(p.Discover().ok());
}

}  // namespace
}  // namespace dpproxy
