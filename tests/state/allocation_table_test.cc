#include "proxy/state/allocation_table.h"

#include <algorithm>
#include <map>
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

// A stream of Allocates: each reservation is answered (its bytes placed
// again with the answer after them), and most are released. What is left
// behind is given back once it outweighs half of what is held, and every
// held allocation reads back as it was written.
TEST(AllocationTableTest, BytesLeftBehindAreGivenBackAndNothingHeldIsLost) {
  AllocationTable t;
  std::map<uint64_t, std::string> want;  // id -> response
  size_t most_stored = 0;
  for (uint64_t id = 1; id <= 20000; ++id) {
    state::Allocation reserved = Make(id, "gpu-" + std::to_string(id % 8));
    reserved.set_stage(state::Allocation::RESERVED);
    t.PutOwnEncoding(id, reserved.SerializeAsString());
    state::Allocation answer;
    answer.set_response("response of " + std::to_string(id));
    ASSERT_TRUE(t.AppendFields(id, answer.SerializeAsString()));
    want[id] = answer.response();
    if (id % 4 != 0) {  // three pods of four end
      want.erase(id);
      ASSERT_TRUE(t.Erase(id));
    }
    most_stored = std::max(most_stored, t.stored_bytes());
    // Never more than half again of what is held, beyond one block.
    ASSERT_LE(t.stored_bytes(), t.held_bytes() * 3 / 2 + AllocationTable::kBlockSize)
        << "after allocation " << id;
  }
  EXPECT_GT(most_stored, 2 * AllocationTable::kBlockSize);  // it did fill blocks
  ASSERT_EQ(t.size(), want.size());
  size_t read = 0;
  t.ForEach([&](const state::Allocation& a) {
    auto w = want.find(a.id());
    ASSERT_NE(w, want.end()) << a.id();
    EXPECT_EQ(a.response(), w->second);
    EXPECT_EQ(a.stage(), state::Allocation::RESERVED);  // WHOLE is not encoded
    EXPECT_EQ(a.device_ids(0), "gpu-" + std::to_string(a.id() % 8));
    ++read;
  });
  EXPECT_EQ(read, want.size());
  // A snapshot of them reads back as the same messages.
  state::State parsed;
  t.CopyTo(&parsed);
  std::string laid;
  t.AppendAsStateField(&laid);
  EXPECT_EQ(laid.size(), t.StateFieldSize());
  state::State back;
  ASSERT_TRUE(back.ParseFromString(laid));
  EXPECT_TRUE(back.SerializeAsString() == parsed.SerializeAsString());
}

// An encoding larger than a quarter of a block gets a block of its own, and
// the block being filled goes on being filled.
TEST(AllocationTableTest, ALargeEncodingIsHeldWhole) {
  AllocationTable t;
  t.Put(Make(1, "small"));
  t.Put(Make(2, "large", AllocationTable::kBlockSize));
  t.Put(Make(3, "small-again"));
  state::Allocation got;
  ASSERT_TRUE(t.Get(2, &got));
  EXPECT_EQ(got.response(), std::string(AllocationTable::kBlockSize, 'r'));
  ASSERT_TRUE(t.Get(3, &got));
  EXPECT_EQ(got.device_ids(0), "small-again");
  EXPECT_EQ(t.stored_bytes(), t.held_bytes());
  ASSERT_TRUE(t.Update(2, [](state::Allocation* a) { a->clear_response(); }));
  ASSERT_TRUE(t.Get(2, &got));
  EXPECT_TRUE(got.response().empty());
  EXPECT_EQ(Ids(t), (std::vector<uint64_t>{1, 2, 3}));
}

// A table moved from is empty and usable; the one moved to holds the bytes.
TEST(AllocationTableTest, AMovedTableKeepsItsAllocations) {
  AllocationTable from;
  for (uint64_t id = 1; id <= 100; ++id) from.Put(Make(id, "d" + std::to_string(id)));
  AllocationTable to;
  to.Put(Make(500, "replaced"));
  to = std::move(from);
  EXPECT_EQ(to.size(), 100u);
  EXPECT_EQ(from.size(), 0u);  // NOLINT(bugprone-use-after-move): moved from is empty
  EXPECT_EQ(from.stored_bytes(), 0u);
  from.Put(Make(7, "again"));
  state::Allocation got;
  ASSERT_TRUE(from.Get(7, &got));
  EXPECT_EQ(got.device_ids(0), "again");
  ASSERT_TRUE(to.Get(100, &got));
  EXPECT_EQ(got.device_ids(0), "d100");
  EXPECT_FALSE(to.Get(500));
  AllocationTable moved(std::move(to));
  EXPECT_EQ(moved.size(), 100u);
  EXPECT_EQ(moved.max_id(), 100u);
}

}  // namespace
}  // namespace dpproxy
