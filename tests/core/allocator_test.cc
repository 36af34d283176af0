// Allocator, the one Allocate of a resource, over a strict mock plugin (no
// socket) and the real journal in a temporary state directory: what reaches
// the plugin, what the journal holds at each step, and what a new dpproxy
// process reads back.
#include "proxy/core/allocator.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/events/event_log.h"
#include "proxy/state/allocation_response.h"
#include "proxy/state/state_keeper.h"
#include "proxy/util/files.h"
#include "tests/testing/mock_backend.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::_;
using ::testing::AnyNumber;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Return;
using ::testing::SaveArg;
using ::testing::StrictMock;
using MockBackend = StrictMock<testing::MockBackend>;

constexpr absl::Duration kWait = absl::Seconds(20);

std::shared_ptr<const DeviceList> Devices(const std::vector<std::string>& healthy,
                                          const std::vector<std::string>& unhealthy = {}) {
  std::vector<v1beta1::Device> out;
  for (const auto* ids : {&healthy, &unhealthy}) {
    for (const std::string& id : *ids) {
      v1beta1::Device d;
      d.set_id(id);
      d.set_health(ids == &healthy ? "Healthy" : "Unhealthy");
      out.push_back(d);
    }
  }
  return DeviceList::FromDevices(std::move(out));
}

v1beta1::AllocateRequest Request(const std::vector<std::vector<std::string>>& containers) {
  v1beta1::AllocateRequest req;
  for (const auto& ids : containers) {
    auto* c = req.add_container_requests();
    for (const std::string& id : ids) c->add_devices_ids(id);
  }
  return req;
}

// The plugin answers each container with its devices as an env.
absl::StatusOr<v1beta1::AllocateResponse> Answer(const v1beta1::AllocateRequest& req) {
  v1beta1::AllocateResponse resp;
  for (const auto& c : req.container_requests()) {
    (*resp.add_container_responses()->mutable_envs())["DEVICES"] =
        absl::StrJoin(c.devices_ids(), ",");
  }
  return resp;
}

class AllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(MakeDirs(dir_.Sub("state")).ok());
    Reopen();
    backend_ = std::make_shared<MockBackend>();
    EXPECT_CALL(*backend_, Start(_)).WillOnce(SaveArg<0>(&backend_->callbacks));
    EXPECT_CALL(*backend_, Stop()).Times(AnyNumber());
    resource_.AttachBackend(backend_);
    backend_->callbacks.on_devices(Devices({"gpu-0", "gpu-1", "gpu-2"}, {"gpu-9"}));
    ASSERT_NE(resource_.backend(), nullptr);
  }
  // The journal as a new dpproxy process finds it.
  void Reopen() {
    allocator_.reset();
    keeper_ = std::make_unique<StateKeeper>(dir_.Sub("state/state.pb"), &events_);
    ASSERT_TRUE(keeper_->Load().ok());
    allocator_ = std::make_unique<Allocator>(&resource_, keeper_.get(), nullptr);
  }
  absl::StatusOr<Allocator::Allocated> Allocate(Allocator::Call call) {
    absl::Notification done;
    absl::StatusOr<Allocator::Allocated> out = absl::UnknownError("never answered");
    allocator_->Allocate(std::move(call), [&](absl::StatusOr<Allocator::Allocated> r) {
      out = std::move(r);
      done.Notify();
    });
    if (!done.WaitForNotificationWithTimeout(kWait)) return absl::DeadlineExceededError("no answer");
    return out;
  }
  absl::StatusOr<Allocator::Allocated> Allocate(const v1beta1::AllocateRequest& req) {
    Allocator::Call call;
    call.request = req;
    return Allocate(std::move(call));
  }
  std::vector<state::Allocation> Held() {
    std::vector<state::Allocation> out;
    keeper_->ForEachAllocation([&](const state::Allocation& a) { out.push_back(a); });
    return out;
  }

  testing::ShortTempDir dir_;
  EventLog events_{"test"};
  Resource resource_{"vendor.com/gpu", ResourcePolicy(), &events_};
  std::unique_ptr<StateKeeper> keeper_;
  std::unique_ptr<Allocator> allocator_;
  std::shared_ptr<MockBackend> backend_;
};

TEST_F(AllocatorTest, AnAnswerIsJournaledBeforeItIsGiven) {
  EXPECT_CALL(*backend_, Allocate(_, _, _)).WillOnce([](auto& req, auto, auto*) {
    return Answer(req);
  });
  absl::StatusOr<Allocator::Allocated> a = Allocate(Request({{"gpu-0", "gpu-1"}, {"gpu-2"}}));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->response.container_responses(1).envs().at("DEVICES"), "gpu-2");
  EXPECT_EQ(a->backend, backend_);
  // One record per container, answered, and there for the next process.
  Reopen();
  const std::vector<state::Allocation> held = Held();
  ASSERT_EQ(held.size(), 2u);
  EXPECT_THAT(held[0].device_ids(), ElementsAre("gpu-0", "gpu-1"));
  EXPECT_EQ(held[0].stage(), state::Allocation::WHOLE);
  EXPECT_EQ(ResponseOf(held[0]).envs().at("DEVICES"), "gpu-0,gpu-1");
  EXPECT_EQ(ResponseOf(held[1]).envs().at("DEVICES"), "gpu-2");
  EXPECT_EQ(held[0].backend_endpoint(), "/run/mock.sock");
}

// The strict mock takes no Allocate: each is refused before the plugin.
TEST_F(AllocatorTest, RequestsTheRulesRefuseNeverReachThePlugin) {
  auto refused = [&](const v1beta1::AllocateRequest& req, absl::StatusCode code,
                     const std::string& why) {
    absl::StatusOr<Allocator::Allocated> a = Allocate(req);
    EXPECT_EQ(a.status().code(), code) << a.status();
    EXPECT_THAT(a.status().message(), HasSubstr(why));
  };
  refused(Request({}), absl::StatusCode::kInvalidArgument, "no container requests");
  refused(Request({{}}), absl::StatusCode::kInvalidArgument, "container request 1 names no device");
  refused(Request({{"gpu-7"}}), absl::StatusCode::kInvalidArgument,
          "unknown device ID \"gpu-7\" for resource vendor.com/gpu");
  refused(Request({{"gpu-0", "gpu-0"}}), absl::StatusCode::kInvalidArgument,
          "names device \"gpu-0\" twice");
  refused(Request({{"gpu-9"}}), absl::StatusCode::kFailedPrecondition,
          "device \"gpu-9\" of resource vendor.com/gpu is Unhealthy");
  EXPECT_TRUE(Held().empty());
}

TEST_F(AllocatorTest, APluginRefusalHoldsNothing) {
  EXPECT_CALL(*backend_, Allocate(_, _, _))
      .WillOnce(Return(absl::UnavailableError("backend /run/mock.sock is gone")));
  absl::StatusOr<Allocator::Allocated> a = Allocate(Request({{"gpu-0"}}));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(a.status().message(), HasSubstr("/run/mock.sock is gone"));
  EXPECT_TRUE(Held().empty());
  Reopen();
  EXPECT_TRUE(Held().empty());
}

// A device a quarantined allocation holds (its container is running, the
// kubelet forgot it) is never journaled for a second holder, whatever the
// plugin answered.
TEST_F(AllocatorTest, AJournalRefusalIsTheAnswerAndHoldsNothingNew) {
  EXPECT_CALL(*backend_, Allocate(_, _, _)).Times(2).WillRepeatedly([](auto& req, auto, auto*) {
    return Answer(req);
  });
  ASSERT_TRUE(Allocate(Request({{"gpu-0"}})).ok());
  ASSERT_EQ(Held().size(), 1u);
  ASSERT_TRUE(keeper_->Quarantine({Held()[0].id()}, "the kubelet forgot it").ok());
  absl::StatusOr<Allocator::Allocated> a = Allocate(Request({{"gpu-0"}}));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(a.status().message(), HasSubstr("still in use"));
  EXPECT_EQ(Held().size(), 1u);
}

// DRA: held from the reservation on, answered in the journal only once the
// caller commits, with what it learned from the whole answer.
TEST_F(AllocatorTest, ADeferredCommitHoldsTheDevicesUntilCommittedOrWithdrawn) {
  EXPECT_CALL(*backend_, Allocate(_, _, _)).Times(2).WillRepeatedly([](auto& req, auto, auto*) {
    return Answer(req);
  });
  Allocator::Call call;
  call.request = Request({{"gpu-0"}});
  call.kubelet_api = "dra";
  call.defer_commit = true;
  state::DraClaim claim;
  claim.set_uid("0badc0de-0000-4000-8000-000000000001");
  claim.set_request("gpu");
  call.claims = {claim};
  absl::StatusOr<Allocator::Allocated> a = Allocate(call);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(Held().size(), 1u);
  EXPECT_EQ(Held()[0].stage(), state::Allocation::RESERVED);
  EXPECT_EQ(Held()[0].claim().uid(), claim.uid());
  EXPECT_TRUE(keeper_->HoldsDevice("vendor.com/gpu", "gpu-0"));

  std::vector<state::DraClaim> named = {claim};
  named[0].add_cdi_ids("vendor.com/gpu=claim-gpu");
  absl::Notification committed;
  allocator_->Commit(a->reservation, a->response, &named, [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    committed.Notify();
  });
  ASSERT_TRUE(committed.WaitForNotificationWithTimeout(kWait));
  Reopen();
  ASSERT_EQ(Held().size(), 1u);
  EXPECT_EQ(Held()[0].stage(), state::Allocation::WHOLE);
  EXPECT_THAT(Held()[0].claim().cdi_ids(), ElementsAre("vendor.com/gpu=claim-gpu"));
  EXPECT_EQ(ResponseOf(Held()[0]).envs().at("DEVICES"), "gpu-0");

  // Withdrawn instead: nothing more is held.
  call.request = Request({{"gpu-1"}});
  absl::StatusOr<Allocator::Allocated> b = Allocate(call);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(keeper_->HoldsDevice("vendor.com/gpu", "gpu-1"));
  allocator_->Withdraw(b->reservation);
  EXPECT_FALSE(keeper_->HoldsDevice("vendor.com/gpu", "gpu-1"));
  Reopen();
  EXPECT_EQ(Held().size(), 1u);
}

TEST_F(AllocatorTest, PreStartRunsPerContainerWhereTheSideAsksAndThePluginNeedsIt) {
  backend_->plugin_options.set_pre_start_required(true);
  EXPECT_CALL(*backend_, Allocate(_, _, _)).Times(2).WillRepeatedly([](auto& req, auto, auto*) {
    return Answer(req);
  });
  std::vector<std::string> started;
  EXPECT_CALL(*backend_, PreStartContainer(_, _, _))
      .Times(2)
      .WillRepeatedly([&](const v1beta1::PreStartContainerRequest& r, auto, auto*) {
        started.push_back(absl::StrJoin(r.devices_ids(), ","));
        return absl::OkStatus();
      });
  Allocator::Call call;
  call.request = Request({{"gpu-0", "gpu-1"}, {"gpu-2"}});
  call.pre_start = true;
  ASSERT_TRUE(Allocate(call).ok());
  EXPECT_THAT(started, ElementsAre("gpu-0,gpu-1", "gpu-2"));
  // A side whose kubelet calls PreStartContainer itself: not here.
  call.pre_start = false;
  ASSERT_TRUE(Allocate(call).ok());
}

TEST_F(AllocatorTest, AFailedPreStartFailsTheAllocateAndHoldsNothing) {
  backend_->plugin_options.set_pre_start_required(true);
  EXPECT_CALL(*backend_, Allocate(_, _, _)).WillOnce([](auto& req, auto, auto*) {
    return Answer(req);
  });
  EXPECT_CALL(*backend_, PreStartContainer(_, _, _))
      .WillOnce(Return(absl::InternalError("device gpu-0 failed to reset")));
  Allocator::Call call;
  call.request = Request({{"gpu-0"}});
  call.pre_start = true;
  absl::StatusOr<Allocator::Allocated> a = Allocate(call);
  EXPECT_THAT(a.status().message(), HasSubstr("failed to reset"));
  EXPECT_TRUE(Held().empty());
}

// dpproxy and its plugin restarting together: the remembered devices are
// shown before the plugin is back, and an Allocate waits for it.
TEST_F(AllocatorTest, ACallWithNoBackendWaitsForOneToRegister) {
  Resource restored("vendor.com/gpu", ResourcePolicy(), &events_);
  restored.Restore(Devices({"gpu-0"}), absl::Minutes(5), "/run/mock.sock", "v1beta1");
  Allocator alloc(&restored, keeper_.get(), nullptr);
  absl::Notification done;
  absl::StatusOr<Allocator::Allocated> out = absl::UnknownError("never answered");
  Allocator::Call call;
  call.request = Request({{"gpu-0"}});
  alloc.Allocate(std::move(call), [&](absl::StatusOr<Allocator::Allocated> r) {
    out = std::move(r);
    done.Notify();
  });
  EXPECT_FALSE(done.HasBeenNotified());  // waiting: no backend yet

  auto back = std::make_shared<MockBackend>();
  EXPECT_CALL(*back, Start(_)).WillOnce(SaveArg<0>(&back->callbacks));
  EXPECT_CALL(*back, Stop()).Times(AnyNumber());
  EXPECT_CALL(*back, Allocate(_, _, _)).WillOnce([](auto& req, auto, auto*) {
    return Answer(req);
  });
  restored.AttachBackend(back);
  back->callbacks.on_devices(Devices({"gpu-0"}));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->backend, back);
  EXPECT_EQ(Held().size(), 1u);
}

}  // namespace
}  // namespace dpproxy
