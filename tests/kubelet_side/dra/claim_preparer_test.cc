// ClaimPreparer with the API-server simulator (real HTTP) holding the
// claims, a mock device plugin behind, and real CDI and state directories.
#include "proxy/kubelet_side/dra/claim_preparer.h"

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/core/allocator.h"
#include "proxy/core/resource.h"
#include "proxy/kubelet_side/dra/cdi_spec.h"
#include "proxy/kubelet_side/dra/device_names.h"
#include "proxy/events/event_log.h"
#include "proxy/state/state_keeper.h"
#include "proxy/util/files.h"
#include "tests/testing/mock_backend.h"
#include "tests/testing/temp_dir.h"
#include "tools/apiserver_sim/apiserver_sim.h"

namespace dpproxy {
namespace {

using ::testing::_;
using ::testing::AnyNumber;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Return;
using ::testing::SaveArg;
using ::testing::StrictMock;
using Json = nlohmann::json;

constexpr char kDriver[] = "gpu.vendor.com";
constexpr char kPool[] = "node-1/vendor.com-gpu";

// The plugin answers each container request with its IDs as an env.
absl::StatusOr<v1beta1::AllocateResponse> Answer(const v1beta1::AllocateRequest& req) {
  v1beta1::AllocateResponse resp;
  for (const auto& c : req.container_requests()) {
    auto* r = resp.add_container_responses();
    std::string ids;
    for (const std::string& id : c.devices_ids()) absl::StrAppend(&ids, ids.empty() ? "" : ",", id);
    (*r->mutable_envs())["GPUS"] = ids;
  }
  return resp;
}

class ClaimPreparerTest : public ::testing::Test {
 protected:
  ClaimPreparerTest() : api_(sim::ApiServerSim::Options{"", "", "t", {"v1"}}) {}
  void SetUp() override {
    ASSERT_TRUE(api_.Start().ok());
    KubeConfig c;
    c.server = api_.url();
    c.token = "t";
    client_ = *KubeClient::Create(c);
    backend_ = std::make_shared<StrictMock<testing::MockBackend>>();
    // The resource as the plugin lists it: every allocation goes through
    // its allocator, which checks the devices against this list.
    EXPECT_CALL(*backend_, Start(_)).WillOnce(SaveArg<0>(&backend_->callbacks));
    EXPECT_CALL(*backend_, Stop()).Times(AnyNumber());
    resource_ = std::make_unique<Resource>("vendor.com/gpu", ResourcePolicy(), &events_);
    resource_->AttachBackend(backend_);
    std::vector<v1beta1::Device> devices;
    for (const char* id : {"gpu-0", "gpu-1", "GPU-X"}) {
      v1beta1::Device d;
      d.set_id(id);
      d.set_health(std::string(kHealthy));
      devices.push_back(d);
    }
    backend_->callbacks.on_devices(DeviceList::FromDevices(std::move(devices)));
    ASSERT_NE(resource_->backend(), nullptr);
    ReopenJournal();
  }
  // The journal as a new dpproxy process finds it.
  void ReopenJournal() {
    keeper_.reset();
    ASSERT_TRUE(MakeDirs(dir_.Sub("state")).ok());
    keeper_ = std::make_unique<StateKeeper>(dir_.Sub("state/state.pb"), &events_);
    absl::StatusOr<state::State> loaded = keeper_->Load();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    allocators_.push_back(std::make_unique<Allocator>(resource_.get(), keeper_.get(), nullptr));
  }
  Allocator* allocator() { return allocators_.back().get(); }
  std::unique_ptr<ClaimPreparer> Preparer() {
    ClaimPreparer::Options o;
    o.driver = kDriver;
    o.node = "node-1";
    o.cdi_dir = dir_.Sub("cdi");
    o.journal = keeper_.get();
    o.claim_files_dir = dir_.Sub("state/dra-claims");
    std::shared_ptr<Backend> backend = backend_;
    Allocator* alloc = allocator();
    return std::make_unique<ClaimPreparer>(
        o, client_.get(),
        [backend, alloc](const std::string& pool) -> std::optional<BridgedResource> {
          if (pool != kPool) return std::nullopt;
          return BridgedResource{"vendor.com/gpu", backend, {"gpu-0", "gpu-1", "GPU-X"}, alloc};
        });
  }
  // A claim allocated by the scheduler: (request, pool, device) results.
  struct Result {
    std::string request, pool, device;
    std::string driver = kDriver;
  };
  ClaimRef Claim(const std::string& name, const std::vector<Result>& results) {
    Json r = Json::array();
    for (const Result& x : results) {
      r.push_back({{"request", x.request}, {"driver", x.driver}, {"pool", x.pool},
                   {"device", x.device}});
    }
    Json claim = {{"metadata", {{"namespace", "default"}, {"name", name}}},
                  {"status", {{"allocation", {{"devices", {{"results", r}}}}}}}};
    claim = api_.PutClaim(claim);
    return {"default", name, claim["metadata"]["uid"]};
  }

  testing::ShortTempDir dir_;
  EventLog events_{"test"};
  std::unique_ptr<Resource> resource_;
  std::unique_ptr<StateKeeper> keeper_;
  std::vector<std::unique_ptr<Allocator>> allocators_;
  sim::ApiServerSim api_;
  std::unique_ptr<KubeClient> client_;
  std::shared_ptr<StrictMock<testing::MockBackend>> backend_;
};

TEST_F(ClaimPreparerTest, OneAllocateWithAContainerRequestPerClaimRequest) {
  const ClaimRef c = Claim("train", {{"a", kPool, "gpu-0"},
                                     {"a", kPool, DraDeviceName("GPU-X")},
                                     {"b", kPool, "gpu-1"},
                                     {"a", "other-pool", "nic-0", "nic.vendor.com"}});
  // The last result is another driver's: left alone.
  EXPECT_CALL(*backend_, Allocate(_, _, _)).WillOnce([](const v1beta1::AllocateRequest& req,
                                                          absl::Duration, auto*) {
    EXPECT_EQ(req.container_requests_size(), 2);
    EXPECT_THAT(req.container_requests(0).devices_ids(), ElementsAre("gpu-0", "GPU-X"));
    EXPECT_THAT(req.container_requests(1).devices_ids(), ElementsAre("gpu-1"));
    return Answer(req);
  });
  std::unique_ptr<ClaimPreparer> p = Preparer();
  absl::StatusOr<std::vector<PreparedClaimDevice>> d = p->Prepare(c);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 3u);
  const std::string kind = CdiKind(kDriver);
  EXPECT_EQ((*d)[0].device, "gpu-0");
  EXPECT_THAT((*d)[0].cdi_ids, ElementsAre(absl::StrCat(kind, "=", c.uid, "-a")));
  EXPECT_THAT((*d)[1].cdi_ids, ElementsAre(absl::StrCat(kind, "=", c.uid, "-a")));
  EXPECT_THAT((*d)[2].cdi_ids, ElementsAre(absl::StrCat(kind, "=", c.uid, "-b")));
  EXPECT_THAT((*d)[2].requests, ElementsAre("b"));
  const Json spec = Json::parse(*ReadFile(ClaimCdiSpecPath(dir_.Sub("cdi"), kDriver, c.uid)));
  ASSERT_EQ(spec["devices"].size(), 2u);
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["env"], Json({"GPUS=gpu-0,GPU-X"}));
}

TEST_F(ClaimPreparerTest, ARepeatedPrepareAnswersTheSameWithoutThePluginAndRestoresTheSpec) {
  const ClaimRef c = Claim("train", {{"a", kPool, "gpu-0"}});
  EXPECT_CALL(*backend_, Allocate(_, _, _)).Times(1).WillOnce([](auto& req, auto, auto*) {
    return Answer(req);
  });
  absl::StatusOr<std::vector<PreparedClaimDevice>> first = Preparer()->Prepare(c);
  ASSERT_TRUE(first.ok()) << first.status();
  // A kubelet restart: prepare again, from a new dpproxy process even.
  ReopenJournal();
  absl::StatusOr<std::vector<PreparedClaimDevice>> again = Preparer()->Prepare(c);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[0].cdi_ids, (*first)[0].cdi_ids);
  // A reboot emptied the CDI directory: the spec comes back, same bytes.
  const std::string spec_path = ClaimCdiSpecPath(dir_.Sub("cdi"), kDriver, c.uid);
  const std::string spec = *ReadFile(spec_path);
  ASSERT_TRUE(RemoveClaimCdiSpec(dir_.Sub("cdi"), kDriver, c.uid).ok());
  ASSERT_TRUE(Preparer()->Prepare(c).ok());
  EXPECT_EQ(*ReadFile(spec_path), spec);
  // Unprepared: gone, and a second unprepare succeeds.
  std::unique_ptr<ClaimPreparer> p = Preparer();
  ASSERT_TRUE(p->Unprepare(c).ok());
  EXPECT_FALSE(PathExists(spec_path));
  EXPECT_TRUE(p->Unprepare(c).ok());
}

// A reboot empties the CDI directory while the kubelet may still count the
// claim prepared and never call prepare: a starting dpproxy writes the
// remembered specs again, without the plugin.
TEST_F(ClaimPreparerTest, AStartWritesTheSpecsOfRememberedClaimsAgain) {
  const ClaimRef c = Claim("train", {{"a", kPool, "gpu-0"}});
  EXPECT_CALL(*backend_, Allocate(_, _, _)).Times(1).WillOnce([](auto& req, auto, auto*) {
    return Answer(req);
  });
  ASSERT_TRUE(Preparer()->Prepare(c).ok());
  const std::string spec_path = ClaimCdiSpecPath(dir_.Sub("cdi"), kDriver, c.uid);
  const std::string spec = *ReadFile(spec_path);
  ASSERT_TRUE(RemoveClaimCdiSpec(dir_.Sub("cdi"), kDriver, c.uid).ok());
  ReopenJournal();
  std::unique_ptr<ClaimPreparer> after_reboot = Preparer();
  absl::StatusOr<int> n = after_reboot->RestoreSpecs();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
  EXPECT_EQ(*ReadFile(spec_path), spec);
  EXPECT_EQ(*after_reboot->RestoreSpecs(), 0);  // nothing gone: nothing written
}

// A prepared claim's devices are held in the journal as any allocation's,
// until the claim is unprepared.
TEST_F(ClaimPreparerTest, APreparedClaimHoldsItsDevicesInTheJournalUntilUnprepared) {
  const ClaimRef c = Claim("train", {{"a", kPool, "gpu-1"}, {"b", kPool, "gpu-0"}});
  EXPECT_CALL(*backend_, Allocate(_, _, _)).WillOnce([](auto& req, auto, auto*) {
    return Answer(req);
  });
  std::unique_ptr<ClaimPreparer> p = Preparer();
  ASSERT_TRUE(p->Prepare(c).ok());
  EXPECT_TRUE(keeper_->HoldsDevice("vendor.com/gpu", "gpu-0"));
  EXPECT_TRUE(keeper_->HoldsDevice("vendor.com/gpu", "gpu-1"));
  EXPECT_FALSE(keeper_->HoldsDevice("vendor.com/gpu", "GPU-X"));
  const std::vector<state::Allocation> held = keeper_->ClaimAllocations(c.uid);
  ASSERT_EQ(held.size(), 2u);  // one per request
  EXPECT_EQ(held[0].claim().request(), "a");
  EXPECT_EQ(held[0].claim().name(), "train");
  EXPECT_FALSE(held[0].claim().cdi_spec().empty());
  EXPECT_EQ(held[0].backend_endpoint(), backend_->endpoint());
  EXPECT_EQ(p->prepared_claims(), 1);
  ASSERT_TRUE(p->Unprepare(c).ok());
  EXPECT_FALSE(keeper_->HoldsDevice("vendor.com/gpu", "gpu-0"));
  EXPECT_TRUE(keeper_->ClaimAllocations(c.uid).empty());
  EXPECT_EQ(p->prepared_claims(), 0);
  // What was unprepared stays gone in the next process.
  ReopenJournal();
  EXPECT_TRUE(keeper_->ClaimAllocations(c.uid).empty());
}

// dpproxy stopped while the plugin allocated for a claim: the journal
// holds the claim's devices as reserved, never answered. The next start
// releases them, and the kubelet's next prepare calls the plugin again.
TEST_F(ClaimPreparerTest, AClaimStoppedMidPrepareIsReleasedAndPreparedAgain) {
  const ClaimRef c = Claim("train", {{"a", kPool, "gpu-0"}});
  state::DraClaim claim;
  claim.set_uid(c.uid);
  claim.set_namespace_(c.namespace_);
  claim.set_name(c.name);
  claim.set_request("a");
  claim.set_pool(kPool);
  claim.add_devices("gpu-0");
  const std::vector<state::DraClaim> claims = {claim};
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("gpu-0");
  BackendSide side;
  side.api = "v1beta1";
  side.endpoint = backend_->endpoint();
  side.claims = &claims;
  absl::Notification durable;
  keeper_->ReserveAsync("vendor.com/gpu", req, side, [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    durable.Notify();
  });
  ASSERT_TRUE(durable.WaitForNotificationWithTimeout(absl::Seconds(20)));
  ReopenJournal();  // the next dpproxy process
  ASSERT_EQ(keeper_->ClaimAllocations(c.uid).size(), 1u);
  EXPECT_TRUE(keeper_->HoldsDevice("vendor.com/gpu", "gpu-0"));

  std::unique_ptr<ClaimPreparer> p = Preparer();
  ASSERT_TRUE(p->RestoreSpecs().ok());
  EXPECT_TRUE(keeper_->ClaimAllocations(c.uid).empty());
  EXPECT_EQ(p->prepared_claims(), 0);
  EXPECT_CALL(*backend_, Allocate(_, _, _)).WillOnce([](auto& req, auto, auto*) {
    return Answer(req);
  });
  ASSERT_TRUE(p->Prepare(c).ok());
  const std::vector<state::Allocation> held = keeper_->ClaimAllocations(c.uid);
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].stage(), state::Allocation::WHOLE);
  EXPECT_FALSE(held[0].claim().cdi_ids().empty());
}

// A claim's devices obey the same rules as a device-plugin allocation's:
// one the plugin reports Unhealthy now is not prepared.
TEST_F(ClaimPreparerTest, ADeviceThePluginReportsUnhealthyIsNotPrepared) {
  std::vector<v1beta1::Device> devices(3);
  devices[0].set_id("gpu-0");
  devices[0].set_health("Healthy");
  devices[1].set_id("gpu-1");
  devices[1].set_health("Unhealthy");
  devices[2].set_id("GPU-X");
  devices[2].set_health("Healthy");
  backend_->callbacks.on_devices(DeviceList::FromDevices(std::move(devices)));
  const ClaimRef c = Claim("train", {{"a", kPool, "gpu-0"}, {"b", kPool, "gpu-1"}});
  // The strict mock takes no Allocate.
  absl::StatusOr<std::vector<PreparedClaimDevice>> d = Preparer()->Prepare(c);
  EXPECT_THAT(d.status().message(),
              HasSubstr("claim default/train: device \"gpu-1\" of resource vendor.com/gpu is "
                        "Unhealthy"));
  EXPECT_TRUE(keeper_->ClaimAllocations(c.uid).empty());
}

// A claim file kept by a dpproxy from before the journal: moved into the
// journal at start (its devices held under their plugin IDs), the file
// removed, and the kubelet's next prepare answered the same, without the
// plugin.
TEST_F(ClaimPreparerTest, AClaimFileFromBeforeTheJournalIsMovedIntoIt) {
  const ClaimRef c = Claim("train", {{"a", kPool, "gpu-0"}});
  const std::string kind = CdiKind(kDriver);
  const std::string cdi = absl::StrCat(kind, "=", c.uid, "-a");
  const Json file = {{"claim", {{"namespace", c.namespace_}, {"name", c.name}, {"uid", c.uid}}},
                     {"devices", Json::array({{{"requests", {"a"}},
                                               {"pool", kPool},
                                               {"device", "gpu-0"},
                                               {"cdi_ids", {cdi}}}})},
                     {"spec", "{\"cdiVersion\":\"0.6.0\"}"}};
  const std::string path = dir_.Sub(absl::StrCat("state/dra-claims/", c.uid, ".json"));
  ASSERT_TRUE(MakeDirs(dir_.Sub("state/dra-claims")).ok());
  ASSERT_TRUE(WriteFileAtomic(path, file.dump()).ok());
  // An unreadable file is left where it is.
  const std::string bad = dir_.Sub("state/dra-claims/00000000-0000-4000-8000-000000000000.json");
  ASSERT_TRUE(WriteFileAtomic(bad, "{\"devices\": 3}").ok());
  std::unique_ptr<ClaimPreparer> p = Preparer();
  absl::StatusOr<int> moved = p->MigrateClaimFiles();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 1);
  EXPECT_FALSE(PathExists(path));
  EXPECT_TRUE(PathExists(bad));
  EXPECT_TRUE(keeper_->HoldsDevice("vendor.com/gpu", "gpu-0"));
  // A reboot emptied the CDI directory: the file's spec comes back.
  ReopenJournal();
  p = Preparer();
  EXPECT_EQ(*p->RestoreSpecs(), 1);
  EXPECT_EQ(*ReadFile(ClaimCdiSpecPath(dir_.Sub("cdi"), kDriver, c.uid)),
            "{\"cdiVersion\":\"0.6.0\"}");
  // The StrictMock backend takes no Allocate: the answer is the file's.
  absl::StatusOr<std::vector<PreparedClaimDevice>> d = p->Prepare(c);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 1u);
  EXPECT_EQ((*d)[0].device, "gpu-0");
  EXPECT_THAT((*d)[0].cdi_ids, ElementsAre(cdi));
  EXPECT_EQ(*p->MigrateClaimFiles(), 0);
}

TEST_F(ClaimPreparerTest, PreStartIsCalledDuringPrepareWhereThePluginRequiresIt) {
  backend_->plugin_options.set_pre_start_required(true);
  const ClaimRef c = Claim("train", {{"a", kPool, "gpu-0"}, {"b", kPool, "gpu-1"}});
  EXPECT_CALL(*backend_, Allocate(_, _, _)).WillOnce([](auto& req, auto, auto*) {
    return Answer(req);
  });
  std::vector<std::string> prestarted;
  EXPECT_CALL(*backend_, PreStartContainer(_, _, _))
      .Times(2)
      .WillRepeatedly([&](const v1beta1::PreStartContainerRequest& r, auto, auto*) {
        prestarted.push_back(r.devices_ids(0));
        return absl::OkStatus();
      });
  ASSERT_TRUE(Preparer()->Prepare(c).ok());
  EXPECT_THAT(prestarted, ElementsAre("gpu-0", "gpu-1"));
}

// A slow plugin answer for one claim does not hold up another's prepare:
// each claim's Allocate waits until the other's has begun.
TEST_F(ClaimPreparerTest, DifferentClaimsArePreparedAtOnce) {
  const ClaimRef a = Claim("a", {{"gpu", kPool, "gpu-0"}});
  const ClaimRef b = Claim("b", {{"gpu", kPool, "gpu-1"}});
  absl::Notification a_in, b_in;
  std::atomic<int> both{0};
  EXPECT_CALL(*backend_, Allocate(_, _, _))
      .Times(2)
      .WillRepeatedly([&](const v1beta1::AllocateRequest& req, absl::Duration, auto*) {
        const bool is_a = req.container_requests(0).devices_ids(0) == "gpu-0";
        (is_a ? a_in : b_in).Notify();
        if ((is_a ? b_in : a_in).WaitForNotificationWithTimeout(absl::Seconds(10))) ++both;
        return Answer(req);
      });
  std::unique_ptr<ClaimPreparer> p = Preparer();
  std::thread other([&] { EXPECT_TRUE(p->Prepare(b).ok()); });
  EXPECT_TRUE(p->Prepare(a).ok());
  other.join();
  EXPECT_EQ(both.load(), 2);  // each saw the other inside the plugin
}

// Device-plugin annotations have no place in DRA: each prepare tells how
// many of a resource's were dropped.
TEST_F(ClaimPreparerTest, WhatDraCannotCarryIsToldPerResource) {
  // A plugin that annotates, asks for PreStart and offers a preferred
  // allocation, for a claim of two requests.
  backend_->plugin_options.set_pre_start_required(true);
  backend_->plugin_options.set_get_preferred_allocation_available(true);
  EXPECT_CALL(*backend_, PreStartContainer(_, _, _)).Times(2);
  const ClaimRef c = Claim("noted", {{"gpu", kPool, "gpu-0"}, {"aux", kPool, "gpu-1"}});
  EXPECT_CALL(*backend_, Allocate(_, _, _)).WillOnce([](auto& req, auto, auto*) {
    absl::StatusOr<v1beta1::AllocateResponse> r = Answer(req);
    (*r->mutable_container_responses(0)->mutable_annotations())["vendor.com/a"] = "1";
    (*r->mutable_container_responses(0)->mutable_annotations())["vendor.com/b"] = "2";
    return r;
  });
  std::vector<std::string> resources;
  Loss told;
  ClaimPreparer::Options o;
  o.driver = kDriver;
  o.node = "node-1";
  o.cdi_dir = dir_.Sub("cdi");
  o.on_loss = [&](const std::string& resource, const Loss& loss) {
    resources.push_back(resource);
    told = loss;
  };
  std::shared_ptr<Backend> backend = backend_;
  Allocator alloc(resource_.get(), nullptr, nullptr);
  ClaimPreparer p(o, client_.get(), [backend, &alloc](const std::string&) {
    return std::optional<BridgedResource>(
        BridgedResource{"vendor.com/gpu", backend, {"gpu-0", "gpu-1"}, &alloc});
  });
  ASSERT_TRUE(p.Prepare(c).ok());
  EXPECT_THAT(resources, ElementsAre("vendor.com/gpu"));  // once, for the whole claim
  EXPECT_EQ(told.annotations, 2);
  EXPECT_EQ(told.prestart_timing, 2);       // one PreStart per request, during prepare
  EXPECT_EQ(told.preferred_allocation, 1);  // one prepare the scheduler chose for
  EXPECT_THAT(DraLossReason("prestart_timing"), HasSubstr("no per-container start"));
  EXPECT_THAT(DraLossReason("preferred_allocation"), HasSubstr("the scheduler chose"));
}

TEST_F(ClaimPreparerTest, EveryFailureNamesTheClaimAndWhy) {
  std::unique_ptr<ClaimPreparer> p = Preparer();
  auto message = [&](const ClaimRef& c) { return std::string(p->Prepare(c).status().message()); };
  ClaimRef c = Claim("train", {{"a", kPool, "gpu-0"}});
  ClaimRef stale = c;
  stale.uid = "0badc0de-0000-4000-8000-000000000001";
  EXPECT_THAT(message(stale), HasSubstr("claim default/train: the API server has UID"));
  EXPECT_THAT(message({"default", "absent", "0badc0de-0000-4000-8000-000000000002"}),
              HasSubstr("not found"));
  ClaimRef pending = {"default", "pending", ""};
  pending.uid = api_.PutClaim({{"metadata", {{"namespace", "default"}, {"name", "pending"}}}})
                    ["metadata"]["uid"];
  EXPECT_THAT(message(pending), HasSubstr("not allocated"));
  EXPECT_THAT(message(Claim("elsewhere", {{"a", "node-9/vendor.com-gpu", "gpu-0"}})),
              HasSubstr("is not one dpproxy publishes"));
  EXPECT_THAT(message(Claim("gone", {{"a", kPool, "gpu-7"}})),
              HasSubstr("gpu-7 of pool node-1/vendor.com-gpu is not among"));
  EXPECT_CALL(*backend_, Allocate(_, _, _))
      .WillOnce(Return(absl::UnavailableError("backend /run/mock.sock is gone")));
  EXPECT_THAT(message(c), HasSubstr("backend /run/mock.sock is gone"));
  // The plugin gone: within the loss grace nothing is prepared without
  // it; after the grace its devices are Unhealthy, and not prepared.
  p->SetBackendTimeout(absl::Milliseconds(100));
  resource_->DetachBackend("the plugin went away");
  EXPECT_THAT(message(c), HasSubstr("no backend is connected for resource vendor.com/gpu"));
  resource_->Tick(absl::Now() + ResourcePolicy().grace);
  EXPECT_THAT(message(c), HasSubstr("\"gpu-0\" of resource vendor.com/gpu is Unhealthy"));
  // Nothing was written for any of them.
  EXPECT_FALSE(PathExists(ClaimCdiSpecPath(dir_.Sub("cdi"), kDriver, c.uid)));
}

// Whatever a caller names, no path outside dpproxy's directories is made
// of it: claim UIDs that climb out, look absolute or hide a NUL are
// refused before any file is touched, and so are names that would change
// the API server's URL.
TEST_F(ClaimPreparerTest, HostileClaimReferencesTouchNothing) {
  std::unique_ptr<ClaimPreparer> p = Preparer();
  testing::ShortTempDir outside;
  const std::string victim = outside.Sub("victim.json");
  ASSERT_TRUE(WriteFileAtomic(victim, "{}").ok());
  const std::string climb = absl::StrCat("../../../../../../../../..", outside.path(), "/victim");
  for (const std::string& uid :
       {climb, outside.Sub("victim"), climb + std::string(1, '\0'), std::string("..") ,
        std::string("0badc0de-0000-4000-8000-00000000000g"), std::string()}) {
    SCOPED_TRACE(uid);
    absl::Status s = p->Unprepare({"default", "x", uid});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("is not a Kubernetes UID"));
    EXPECT_EQ(p->Prepare({"default", "x", uid}).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(PathExists(victim)) << "a file outside dpproxy's directories was removed";
  const std::string uid = "0badc0de-0000-4000-8000-000000000003";
  EXPECT_THAT(p->Prepare({"default", "x/../../secrets/y", uid}).status().message(),
              HasSubstr("is not a DNS subdomain"));
  EXPECT_THAT(p->Prepare({"kube-system?x=", "x", uid}).status().message(),
              HasSubstr("is not a DNS label"));
}

// A claim whose fields have the wrong types fails that claim, naming the
// field, instead of an exception.
TEST_F(ClaimPreparerTest, AClaimOfTheWrongShapeFailsNamingTheField) {
  std::unique_ptr<ClaimPreparer> p = Preparer();
  Json claim = {{"metadata", {{"namespace", "default"}, {"name", "odd"}}},
                {"status", {{"allocation", {{"devices", {{"results", {{{"device", 7}}}}}}}}}}};
  claim = api_.PutClaim(claim);
  absl::Status s = p->Prepare({"default", "odd", claim["metadata"]["uid"]}).status();
  EXPECT_THAT(s.message(), HasSubstr("status.allocation.devices.results[0].device is an integer, "
                                     "not a string"));
  Json arrays = {{"metadata", {{"namespace", "default"}, {"name", "arrays"}}},
                 {"status", {{"allocation", {{"devices", Json::array()}}}}}};
  arrays = api_.PutClaim(arrays);
  s = p->Prepare({"default", "arrays", arrays["metadata"]["uid"]}).status();
  EXPECT_THAT(s.message(), HasSubstr("status.allocation.devices is an array, not an object"));
}

// A claim the scheduler made for a pod's extended-resource request is
// known by its annotation (only "true" counts), and an ordinary one is not.
TEST(ParseClaimTest, TellsAnExtendedResourceClaimByItsAnnotation) {
  auto claim = [](nlohmann::json annotations) {
    nlohmann::json c = {{"metadata", {{"uid", "u-1"}}},
                        {"status",
                         {{"allocation",
                           {{"devices",
                             {{"results",
                               {{{"request", "container-0-request-0"},
                                 {"driver", "gpu.vendor.com"},
                                 {"pool", "node-1/vendor.com-gpu"},
                                 {"device", "gpu-0"}}}}}}}}}}};
    if (!annotations.is_null()) c["metadata"]["annotations"] = annotations;
    return c;
  };
  absl::StatusOr<ClaimFromApi> pod = ParseClaim(
      claim({{"resource.kubernetes.io/extended-resource-claim", "true"}}));
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_TRUE(pod->extended_resource);
  ASSERT_EQ(pod->results.size(), 1u);
  for (const nlohmann::json& a :
       {nlohmann::json(), nlohmann::json::object(),
        nlohmann::json{{"resource.kubernetes.io/extended-resource-claim", "false"}},
        nlohmann::json{{"resource.kubernetes.io/extended-resource-claim", true}},
        nlohmann::json::array()}) {
    absl::StatusOr<ClaimFromApi> plain = ParseClaim(claim(a));
    ASSERT_TRUE(plain.ok()) << a.dump() << ": " << plain.status();
    EXPECT_FALSE(plain->extended_resource) << a.dump();
  }
}

}  // namespace
}  // namespace dpproxy
