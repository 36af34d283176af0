// The records of an allocation's steps (journal_records.h), as the journal
// replays them.
#include "proxy/state/journal_records.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proxy/state/allocation_response.h"

namespace dpproxy {
namespace {

v1beta1::AllocateRequest TwoContainers() {
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("gpu-0");
  auto* c = req.add_container_requests();
  c->add_devices_ids("gpu-1");
  c->add_devices_ids("gpu-2");
  return req;
}

TEST(JournalRecordsTest, AReservationHoldsEverythingButTheResponse) {
  const v1beta1::AllocateRequest req = TwoContainers();
  v1beta1::AllocateRequest plugin_side = req;  // the plugin knows gpu-2 as 7
  plugin_side.mutable_container_requests(1)->set_devices_ids(1, "7");
  BackendSide backend;
  backend.api = "v1alpha";
  backend.endpoint = "/var/lib/dpproxy/plugins/vendor.sock";
  backend.resource = "vendor.com/gpu";
  backend.request = &plugin_side;

  const std::vector<state::Allocation> r =
      AllocationRecords("example.com/gpu", req, nullptr, backend, 41, 1234);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].id(), 41u);
  EXPECT_EQ(r[1].id(), 42u);
  for (const state::Allocation& a : r) {
    EXPECT_EQ(a.stage(), state::Allocation::RESERVED);
    EXPECT_TRUE(a.response().empty());
    EXPECT_EQ(a.resource(), "example.com/gpu");
    EXPECT_EQ(a.backend_api(), "v1alpha");
    EXPECT_EQ(a.backend_resource(), "vendor.com/gpu");
    EXPECT_EQ(a.allocated_unix_ms(), 1234);
  }
  EXPECT_EQ(r[1].device_ids_size(), 2);
  // Only where the plugin's IDs differ are they kept.
  EXPECT_EQ(r[0].backend_device_ids_size(), 0);
  ASSERT_EQ(r[1].backend_device_ids_size(), 2);
  EXPECT_EQ(r[1].backend_device_ids(1), "7");
}

// An answer appended to a reservation's bytes reads back as the whole
// allocation: the response set and the stage ended, nothing else changed.
TEST(JournalRecordsTest, AnAnswersFieldsAppendedToAReservationMakeItWhole) {
  const v1beta1::AllocateRequest req = TwoContainers();
  v1beta1::AllocateResponse resp;
  (*resp.add_container_responses()->mutable_envs())["GPU"] = "0";
  (*resp.add_container_responses()->mutable_envs())["GPU"] = "1,2";
  const std::vector<state::Allocation> reserved =
      AllocationRecords("example.com/gpu", req, nullptr, BackendSide{}, 1, 0);
  AllocationJournal::Reservation r;
  r.first_id = 1;
  r.count = 2;
  const std::vector<state::Allocation> answers = AnswerRecords(r, resp, nullptr);
  ASSERT_EQ(answers.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(answers[i].stage(), state::Allocation::ANSWERED);
    state::Allocation whole;
    ASSERT_TRUE(whole.ParseFromString(reserved[i].SerializeAsString() +
                                      AnswerFields(answers[i])));
    EXPECT_EQ(whole.stage(), state::Allocation::WHOLE);
    EXPECT_EQ(whole.id(), reserved[i].id());
    EXPECT_EQ(whole.device_ids_size(), reserved[i].device_ids_size());
    EXPECT_EQ(ResponseOf(whole).envs().at("GPU"), i == 0 ? "0" : "1,2");
  }
}

TEST(JournalRecordsTest, AWithdrawalNamesEachAllocationOfTheReservation) {
  AllocationJournal::Reservation r;
  r.first_id = 7;
  r.count = 3;
  const std::vector<state::Allocation> w = WithdrawalRecords(r);
  ASSERT_EQ(w.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(w[i].id(), 7u + i);
    EXPECT_EQ(w[i].stage(), state::Allocation::WITHDRAWN);
    EXPECT_TRUE(w[i].resource().empty());
  }
  EXPECT_TRUE(WithdrawalRecords(std::vector<uint64_t>{}).empty());
}

}  // namespace
}  // namespace dpproxy
