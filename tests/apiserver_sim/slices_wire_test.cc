// ResourceSlices on the API-server simulator's wire as a client-go driver
// uses it: bodies in Kubernetes protobuf, names from generateName, and the
// reflector's watch (initial events with their bookmark, then every change
// in order, 410 Gone for a resourceVersion older than the history kept).
#include <httplib.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/apiserver_sim/apiserver_sim.h"
#include "tools/apiserver_sim/k8s_protobuf.h"
#include "tools/apiserver_sim/k8s_protobuf.pb.h"

namespace dpproxy::sim {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

constexpr char kSlices[] = "/apis/resource.k8s.io/v1/resourceslices";
constexpr absl::Duration kWait = absl::Seconds(10);

// A slice of node `node` as JSON, `devices` devices named dev-0...
Json Slice(const std::string& name, const std::string& node, int devices = 1) {
  Json d = Json::array();
  for (int i = 0; i < devices; ++i) d.push_back({{"name", absl::StrCat("dev-", i)}});
  return {{"metadata", {{"name", name}}},
          {"spec",
           {{"driver", "gpu.example.com"},
            {"nodeName", node},
            {"pool", {{"name", node}, {"generation", 1}, {"resourceSliceCount", 1}}},
            {"devices", d}}}};
}

// An object in Kubernetes protobuf, as client-go's clientset sends one: the
// magic, then the envelope naming its apiVersion and kind around it.
std::string Protobuf(const std::string& api_version, const std::string& kind,
                     const google::protobuf::Message& object) {
  k8s::Unknown envelope;
  envelope.mutable_typemeta()->set_apiversion(api_version);
  envelope.mutable_typemeta()->set_kind(kind);
  envelope.set_raw(object.SerializeAsString());
  return std::string("k8s\0", 4) + envelope.SerializeAsString();
}

std::string ProtobufSlice(const std::string& api_version, const google::protobuf::Message& slice) {
  return Protobuf(api_version, "ResourceSlice", slice);
}

class SlicesWireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.Start().ok());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", api_.port());
  }
  void TearDown() override { api_.Stop(); }

  httplib::Result Post(const Json& body) {
    return client_->Post(kSlices, body.dump(), "application/json");
  }

  ApiServerSim api_{ApiServerSim::Options{"", "", "", {"v1", "v1beta1"}}};
  std::unique_ptr<httplib::Client> client_;
};

// A watch read on a thread of its own, its events kept as they come.
class Watch {
 public:
  Watch(int port, const std::string& query) {
    thread_ = std::thread([this, port, query] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(60, 0);  // events come when the test makes them
      httplib::Result r = c.Get(absl::StrCat(kSlices, "?watch=true&", query),
                                [this](const char* data, size_t n) {
                                  absl::MutexLock lock(&mu_);
                                  buffer_.append(data, n);
                                  return true;
                                });
      absl::MutexLock lock(&mu_);
      ended_ = true;
      status_ = r ? r->status : -1;
    });
  }
  ~Watch() {
    if (thread_.joinable()) thread_.join();
  }

  // The first `n` events, or fewer if they did not come within kWait.
  std::vector<Json> Events(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ended_ || Parsed().size() >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
    return Parsed();
  }
  // Whether the stream ended (the server closed it) within kWait.
  bool Ended() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&ended_), kWait);
  }
  int status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  std::vector<Json> Parsed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Json> out;
    for (absl::string_view line : absl::StrSplit(buffer_, '\n', absl::SkipEmpty())) {
      Json j = Json::parse(line, nullptr, false);
      if (!j.is_discarded()) out.push_back(std::move(j));
    }
    return out;
  }

  absl::Mutex mu_;
  std::string buffer_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  int status_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

TEST_F(SlicesWireTest, AWatchListStartsWithTheSelectedSlicesAndABookmark) {
  ASSERT_EQ(Post(Slice("a", "node-1"))->status, 201);
  ASSERT_EQ(Post(Slice("b", "node-2"))->status, 201);
  Watch w(api_.port(),
          "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&"
          "fieldSelector=spec.driver%3Dgpu.example.com%2Cspec.nodeName%3Dnode-1");
  std::vector<Json> e = w.Events(2);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0]["type"], "ADDED");
  EXPECT_EQ(e[0]["object"]["metadata"]["name"], "a");
  EXPECT_EQ(e[1]["type"], "BOOKMARK");
  EXPECT_EQ(e[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
  // The bookmark carries the version the list was read at: the newest.
  EXPECT_GE(std::stoll(e[1]["object"]["metadata"]["resourceVersion"].get<std::string>()),
            std::stoll(e[0]["object"]["metadata"]["resourceVersion"].get<std::string>()));
  api_.Stop();
  EXPECT_TRUE(w.Ended()) << "Stop() ends the open watch";
}

TEST_F(SlicesWireTest, AWatchFromAResourceVersionStreamsEachChangeInOrder) {
  ASSERT_EQ(Post(Slice("old", "node-1"))->status, 201);
  httplib::Result list = client_->Get(kSlices);
  ASSERT_TRUE(list);
  const std::string rv = Json::parse(list->body)["metadata"]["resourceVersion"];
  Watch w(api_.port(), "resourceVersion=" + rv + "&fieldSelector=spec.nodeName%3Dnode-1");

  Json named = Slice("", "node-1");
  named["metadata"] = {{"generateName", "node-1-gpu.example.com-"}};
  httplib::Result made = Post(named);
  ASSERT_EQ(made->status, 201) << made->body;
  Json slice = Json::parse(made->body);
  const std::string name = slice["metadata"]["name"];
  EXPECT_THAT(name, ::testing::StartsWith("node-1-gpu.example.com-"));
  EXPECT_EQ(name.size(), std::string("node-1-gpu.example.com-").size() + 5);
  ASSERT_EQ(Post(Slice("elsewhere", "node-2"))->status, 201);
  slice["spec"]["pool"]["generation"] = 2;
  ASSERT_EQ(client_->Put(absl::StrCat(kSlices, "/", name), slice.dump(), "application/json")
                ->status,
            200);
  ASSERT_EQ(client_->Delete(absl::StrCat(kSlices, "/", name))->status, 200);
  EXPECT_EQ(api_.DeleteSlicesOfNode("node-1"), 1);  // "old", as a starting kubelet does

  std::vector<Json> e = w.Events(4);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0]["type"], "ADDED");
  EXPECT_EQ(e[1]["type"], "MODIFIED");
  EXPECT_EQ(e[1]["object"]["spec"]["pool"]["generation"], 2);
  EXPECT_EQ(e[2]["type"], "DELETED");
  EXPECT_EQ(e[2]["object"]["metadata"]["name"], name);
  EXPECT_EQ(e[3]["type"], "DELETED");
  EXPECT_EQ(e[3]["object"]["metadata"]["name"], "old");
  int64_t last = 0;
  for (const Json& ev : e) {
    const int64_t v = std::stoll(ev["object"]["metadata"]["resourceVersion"].get<std::string>());
    EXPECT_GT(v, last) << ev.dump();
    last = v;
  }
  api_.Stop();
  EXPECT_TRUE(w.Ended());
}

TEST_F(SlicesWireTest, AResourceVersionOlderThanTheHistoryIsGone) {
  httplib::Result made = Post(Slice("s", "node-1"));
  ASSERT_EQ(made->status, 201);
  Json s = Json::parse(made->body);
  const std::string first = s["metadata"]["resourceVersion"];
  // More changes than the simulator keeps for watchers.
  for (int i = 0; i < 4200; ++i) {
    httplib::Result r = client_->Put(absl::StrCat(kSlices, "/s"), s.dump(), "application/json");
    ASSERT_EQ(r->status, 200) << r->body;
    s = Json::parse(r->body);
  }
  httplib::Result r = client_->Get(absl::StrCat(kSlices, "?watch=true&resourceVersion=", first));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 410);
  EXPECT_EQ(Json::parse(r->body)["reason"], "Expired");
  EXPECT_THAT(r->body, HasSubstr("too old resource version"));
}

TEST_F(SlicesWireTest, AProtobufSliceIsStoredAsTheApiServersJson) {
  k8s::ResourceSlice s;
  s.mutable_metadata()->set_generatename("node-1-gpu.example.com-");
  s.mutable_metadata()->set_selflink("");  // Go writes empty strings too
  s.mutable_metadata()->mutable_creationtimestamp();  // and a zero time
  k8s::OwnerReference* owner = s.mutable_metadata()->add_ownerreferences();
  owner->set_apiversion("v1");
  owner->set_kind("Node");
  owner->set_name("node-1");
  owner->set_uid("u-1");
  s.mutable_spec()->set_driver("gpu.example.com");
  s.mutable_spec()->set_nodename("node-1");
  s.mutable_spec()->mutable_pool()->set_name("node-1");
  s.mutable_spec()->mutable_pool()->set_generation(3);
  s.mutable_spec()->mutable_pool()->set_resourceslicecount(1);
  k8s::Device* d = s.mutable_spec()->add_devices();
  d->set_name("gpu-0");
  (*d->mutable_attributes())["index"].set_int_(0);
  (*d->mutable_attributes())["model"].set_string("a100");
  (*d->mutable_capacity())["memory"].mutable_value()->set_string("80Gi");

  httplib::Result r = client_->Post(kSlices, ProtobufSlice("resource.k8s.io/v1", s),
                                    kKubernetesProtobuf);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 201) << r->body;
  const std::string name = Json::parse(r->body)["metadata"]["name"];
  Json got = Json::parse(client_->Get(absl::StrCat(kSlices, "/", name))->body);
  EXPECT_EQ(got["kind"], "ResourceSlice");
  EXPECT_EQ(got["spec"]["pool"]["generation"], 3);  // a number, as in JSON
  EXPECT_EQ(got["spec"]["devices"][0]["attributes"]["index"]["int"], 0);
  EXPECT_EQ(got["spec"]["devices"][0]["attributes"]["model"]["string"], "a100");
  EXPECT_EQ(got["spec"]["devices"][0]["capacity"]["memory"]["value"], "80Gi");
  EXPECT_EQ(got["metadata"]["ownerReferences"][0]["uid"], "u-1");
  EXPECT_FALSE(got["metadata"].contains("creationTimestamp") &&
               !got["metadata"]["creationTimestamp"].is_null());
}

TEST_F(SlicesWireTest, AV1beta1ProtobufSliceKeepsItsDevicesUnderBasic) {
  k8s::ResourceSliceV1beta1 s;
  s.mutable_metadata()->set_name("old-api");
  s.mutable_spec()->set_driver("gpu.example.com");
  s.mutable_spec()->set_nodename("node-1");
  s.mutable_spec()->mutable_pool()->set_name("node-1");
  s.mutable_spec()->mutable_pool()->set_generation(1);
  s.mutable_spec()->mutable_pool()->set_resourceslicecount(1);
  k8s::DeviceV1beta1* d = s.mutable_spec()->add_devices();
  d->set_name("gpu-0");
  (*d->mutable_basic()->mutable_attributes())["index"].set_int_(0);
  httplib::Result r = client_->Post("/apis/resource.k8s.io/v1beta1/resourceslices",
                                    ProtobufSlice("resource.k8s.io/v1beta1", s),
                                    kKubernetesProtobuf);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Json::parse(r->body)["spec"]["devices"][0]["basic"]["attributes"]["index"]["int"], 0);
}

TEST_F(SlicesWireTest, AProtobufFieldTheSimulatorCannotReadIsRefusedByNumber) {
  k8s::ResourceSlice s;
  s.mutable_metadata()->set_name("s");
  s.mutable_spec()->set_driver("gpu.example.com");
  // Field 14 of a device (nodeAllocatableResources) is not declared.
  k8s::Device* d = s.mutable_spec()->add_devices();
  d->set_name("gpu-0");
  d->GetReflection()->MutableUnknownFields(d)->AddLengthDelimited(14, "x");
  httplib::Result r = client_->Post(kSlices, ProtobufSlice("resource.k8s.io/v1", s),
                                    kKubernetesProtobuf);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 415);
  EXPECT_THAT(r->body, HasSubstr("spec.devices[0] has field number 14"));
  EXPECT_TRUE(api_.Slices().empty()) << "nothing stored";
}

TEST(KubernetesProtobufTest, NamesWhatItCannotRead) {
  EXPECT_THAT(KubernetesProtobufToJson("{\"kind\":\"ResourceSlice\"}").status().message(),
              HasSubstr("magic"));
  absl::StatusOr<Json> pod = KubernetesProtobufToJson(Protobuf("v1", "Pod", k8s::ObjectMeta()));
  EXPECT_THAT(pod.status().message(), HasSubstr("no Pod of v1"));
  k8s::Unknown envelope;
  envelope.mutable_typemeta()->set_apiversion("resource.k8s.io/v1");
  envelope.mutable_typemeta()->set_kind("ResourceSlice");
  envelope.set_contentencoding("gzip");
  EXPECT_THAT(KubernetesProtobufToJson(std::string("k8s\0", 4) + envelope.SerializeAsString())
                  .status()
                  .message(),
              HasSubstr("gzip"));
}

}  // namespace
}  // namespace dpproxy::sim
