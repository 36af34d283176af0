#include "proxy/state/allocation_table.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {
namespace {

state::Allocation Make(uint64_t id, const std::string& device, size_t response_bytes = 0) {
  state::Allocation a;
  a.set_id(id);
  a.set_resource("vendor.com/gpu");
  a.add_device_ids(device);
  a.set_pod_name("pod-" + device);
  a.set_response(std::string(response_bytes, 'r'));
  return a;
}

std::vector<uint64_t> Ids(const AllocationTable& t) {
  std::vector<uint64_t> out;
  t.ForEach([&](const state::Allocation& a) { out.push_back(a.id()); });
  return out;
}

// A snapshot lays the allocations' bytes end to end: what protobuf itself
// writes for them, lengths of one byte and of more.
TEST(AllocationTableTest, EncodesAsTheStatesOwnAllocationsField) {
  state::State want;
  AllocationTable t;
  for (uint64_t id : {1u, 2u, 3u}) {
    const state::Allocation a = Make(id, "gpu-" + std::to_string(id), id == 2 ? 300 : 0);
    *want.add_allocations() = a;
    t.Put(a);
  }
  std::string got;
  t.AppendAsStateField(&got);
  EXPECT_EQ(got, want.SerializeAsString());
  EXPECT_EQ(got.size(), t.StateFieldSize());
  state::State back;
  ASSERT_TRUE(back.ParseFromString(got));
  EXPECT_EQ(back.allocations(1).response().size(), 300u);
}

TEST(AllocationTableTest, HeldInIdOrderFoundChangedAndRemovedById) {
  AllocationTable t;
  for (uint64_t id : {5u, 1u, 9u, 3u}) t.Put(Make(id, "d" + std::to_string(id)));
  EXPECT_EQ(Ids(t), (std::vector<uint64_t>{1, 3, 5, 9}));
  EXPECT_EQ(t.max_id(), 9u);

  state::Allocation got;
  ASSERT_TRUE(t.Get(5, &got));
  EXPECT_EQ(got.device_ids(0), "d5");
  EXPECT_FALSE(t.Get(4, &got));

  // A change keeps the id, whatever the change does to it.
  EXPECT_TRUE(t.Update(5, [](state::Allocation* a) {
    a->set_pod_name("renamed");
    a->set_id(77);
  }));
  ASSERT_TRUE(t.Get(5, &got));
  EXPECT_EQ(got.pod_name(), "renamed");
  EXPECT_FALSE(t.Get(77));
  EXPECT_FALSE(t.Update(4, [](state::Allocation*) { ADD_FAILURE() << "called for no allocation"; }));

  state::Allocation removed;
  EXPECT_TRUE(t.Erase(3, &removed));
  EXPECT_EQ(removed.device_ids(0), "d3");
  EXPECT_FALSE(t.Erase(3));
  EXPECT_EQ(Ids(t), (std::vector<uint64_t>{1, 5, 9}));

  const std::vector<state::Allocation> range = t.EraseRange(2, 9);
  ASSERT_EQ(range.size(), 1u);
  EXPECT_EQ(range[0].id(), 5u);
  EXPECT_EQ(Ids(t), (std::vector<uint64_t>{1, 9}));
  EXPECT_TRUE(t.EraseRange(9, 9).empty());
  EXPECT_EQ(t.size(), 2u);
}

// Fields appended to an allocation's bytes replace the ones they name, as
// protobuf reads them back; the encoding put in is kept as it is.
TEST(AllocationTableTest, AppendedFieldsReplaceTheOnesTheyName) {
  AllocationTable t;
  state::Allocation reserved = Make(3, "gpu-3");
  reserved.set_stage(state::Allocation::RESERVED);
  t.PutOwnEncoding(3, reserved.SerializeAsString());
  state::Allocation answer;
  answer.set_response("the answer");
  answer.set_stage(state::Allocation::WITHDRAWN);  // encoded, unlike WHOLE
  EXPECT_TRUE(t.AppendFields(3, answer.SerializeAsString()));
  EXPECT_FALSE(t.AppendFields(4, answer.SerializeAsString()));
  state::Allocation got;
  ASSERT_TRUE(t.Get(3, &got));
  EXPECT_EQ(got.response(), "the answer");
  EXPECT_EQ(got.stage(), state::Allocation::WITHDRAWN);
  EXPECT_EQ(got.device_ids(0), "gpu-3");
}

TEST(AllocationTableTest, ARepeatedIdIsKeptAsideAndRenumberedNotDropped) {
  AllocationTable t;
  EXPECT_TRUE(t.PutEncoded(Make(4, "first").SerializeAsString()));
  EXPECT_TRUE(t.PutEncoded(Make(4, "second").SerializeAsString()));
  EXPECT_TRUE(t.PutEncoded(Make(6, "third").SerializeAsString()));
  state::State from;
  *from.add_allocations() = Make(6, "fourth");
  t.TakeFrom(&from);
  EXPECT_EQ(from.allocations_size(), 0);
  EXPECT_EQ(t.size(), 2u);

  uint64_t last_id = 5;
  EXPECT_EQ(t.RenumberDuplicates(&last_id), 2);
  EXPECT_EQ(last_id, 8u);
  std::vector<std::string> devices;
  t.ForEach([&](const state::Allocation& a) {
    devices.push_back(std::to_string(a.id()) + ":" + a.device_ids(0));
  });
  EXPECT_EQ(devices, (std::vector<std::string>{"4:first", "6:third", "7:second", "8:fourth"}));
  EXPECT_EQ(t.RenumberDuplicates(&last_id), 0);
}

TEST(AllocationTableTest, BytesThatDoNotParseAreRefused) {
  AllocationTable t;
  EXPECT_FALSE(t.PutEncoded(std::string("\x0a\x05gpu", 5)));  // a length past the end
  EXPECT_TRUE(t.empty());
}

}  // namespace
}  // namespace dpproxy
