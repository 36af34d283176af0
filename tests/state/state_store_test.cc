#include "proxy/state/state_store.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <unistd.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "proxy/util/files.h"
#include "proxy/state/allocation_response.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/state_dir.h"
#include "proxy/state/state_keeper.h"
#include "tests/state/state_samples.h"
#include "tests/testing/file_size_limit.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;
using testing::FileSizeLimit;
using testing::Names;
using testing::Sample;
using testing::SetEnv;

// The response is held as bytes under the field number and wire type the
// message field always had: an allocation written with the message reads
// back with the same answer, and is written back byte for byte.
TEST(AllocationResponseTest, RecordsWrittenWithTheMessageFieldReadTheSame) {
  v1beta1::ContainerAllocateResponse answer;
  (*answer.mutable_envs())["GPU"] = "gpu-3";
  answer.add_devices()->set_host_path("/dev/gpu3");
  const std::string answer_bytes = answer.SerializeAsString();
  // Field 1 (id) = 7, then field 4 as a length-delimited message, as a
  // release that declared it a v1beta1.ContainerAllocateResponse wrote it.
  std::string old_record;
  old_record += static_cast<char>((1 << 3) | 0);
  old_record += static_cast<char>(7);
  old_record += static_cast<char>((4 << 3) | 2);
  ASSERT_LT(answer_bytes.size(), 128u);
  old_record += static_cast<char>(answer_bytes.size());
  old_record += answer_bytes;
  state::Allocation a;
  ASSERT_TRUE(a.ParseFromString(old_record));
  EXPECT_EQ(a.id(), 7u);
  const v1beta1::ContainerAllocateResponse read = ResponseOf(a);
  EXPECT_EQ(read.envs().at("GPU"), "gpu-3");
  ASSERT_EQ(read.devices_size(), 1);
  EXPECT_EQ(read.devices(0).host_path(), "/dev/gpu3");
  EXPECT_EQ(a.SerializeAsString(), old_record);
}

TEST(StateFileTest, RoundTrips) {
  absl::StatusOr<state::State> back = DecodeStateFile(EncodeStateFile(Sample()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), Sample().SerializeAsString());
}

TEST(StateFileTest, EveryKindOfDamageIsDetected) {
  const std::string good = EncodeStateFile(Sample());
  struct Case {
    std::string bytes;
    const char* reason;
  };
  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 0x01;
  std::string version = good;
  version[8] = 2;
  std::string magic = good;
  magic[0] = 'X';
  const Case cases[] = {
      {good.substr(0, 10), "truncated"},
      {good.substr(0, good.size() - 1), "truncated or padded"},
      {good + "x", "truncated or padded"},
      {flipped, "checksum mismatch"},
      {version, "unknown format version 2"},
      {magic, "bad magic"},
      {"", "truncated"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<state::State> s = DecodeStateFile(c.bytes);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << c.reason;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.reason));
  }
}

// A sink that keeps each allocation's bytes in `taken`.
AllocationSink KeepInto(std::vector<std::string>* taken) {
  return [taken](absl::string_view wire) {
    taken->emplace_back(wire);
    return true;
  };
}

// A loader that takes the allocations apart gets each one's bytes in the
// file's order, and the rest parsed as the State.
TEST(StateFileTest, AllocationsCanBeTakenAsTheirBytes) {
  state::State s = Sample();
  state::Allocation* second = s.add_allocations();
  second->set_id(2);
  second->set_resource("vendor.com/gpu");
  second->add_device_ids("gpu-1");
  std::vector<std::string> taken;
  absl::StatusOr<state::State> back = DecodeStateFile(EncodeStateFile(s), KeepInto(&taken));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0], s.allocations(0).SerializeAsString());
  EXPECT_EQ(taken[1], s.allocations(1).SerializeAsString());
  state::State rest = s;
  rest.clear_allocations();
  EXPECT_EQ(back->SerializeAsString(), rest.SerializeAsString());
}

// Framing protobuf never writes (here a tag in two bytes where one does)
// is read by protobuf's own parser, and the allocations still handed over.
TEST(StateFileTest, AllocationsFramedUnusuallyAreStillTaken) {
  const std::string a = Sample().allocations(0).SerializeAsString();
  ASSERT_LT(a.size(), 128u);
  std::string payload("\x92\x00", 2);  // field 2, length-delimited, not minimal
  payload.push_back(static_cast<char>(a.size()));
  payload += a;
  std::vector<std::string> taken;
  absl::StatusOr<state::State> back =
      DecodeStateFile(EncodeStateFilePayload(payload), KeepInto(&taken));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->allocations_size(), 0);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0], a);
}

// An allocation that does not parse, under a good checksum, fails the file
// as a whole, as protobuf's parser would.
TEST(StateFileTest, AnAllocationThatDoesNotParseFailsTheFile) {
  state::State s;
  s.set_next_allocation_id(1);
  std::string payload = s.SerializeAsString();
  payload += std::string("\x12\x03\x0a\x05g", 5);  // an allocation; its string runs past it
  for (bool take : {false, true}) {
    absl::StatusOr<state::State> back =
        DecodeStateFile(EncodeStateFilePayload(payload),
                        take ? AllocationSink([](absl::string_view wire) {
                          return AllocationTable().PutEncoded(wire);
                        })
                             : AllocationSink());
    EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss) << take;
    EXPECT_THAT(std::string(back.status().message()), HasSubstr("does not parse")) << take;
  }
  // Cut inside an allocation's bytes, the same.
  state::State one;
  *one.add_allocations() = Sample().allocations(0);
  std::string cut = one.SerializeAsString();
  cut.resize(cut.size() - 2);
  EXPECT_EQ(DecodeStateFile(EncodeStateFilePayload(cut), [](absl::string_view) { return true; })
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

TEST(FileStateStoreTest, MissingFileIsAFreshStart) {
  testing::ShortTempDir dir;
  FileStateStore store(dir.Sub("state.pb"));
  absl::StatusOr<state::State> s = store.Load();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->allocations_size(), 0);
}

TEST(FileStateStoreTest, CorruptFileIsMovedAsideNotLoaded) {
  testing::ShortTempDir dir;
  FileStateStore store(dir.Sub("state.pb"));
  ASSERT_TRUE(store.Save(Sample()).ok());
  std::string bytes = *ReadFile(dir.Sub("state.pb"));
  bytes[bytes.size() / 2] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("state.pb"), bytes).ok());
  absl::StatusOr<state::State> s = store.Load();
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("moved aside to"));
  EXPECT_FALSE(PathExists(dir.Sub("state.pb")));
  std::vector<std::string> names = Names(dir.path());
  ASSERT_EQ(names.size(), 1u);
  EXPECT_THAT(names[0], HasSubstr("state.pb.corrupt-"));
  EXPECT_EQ(*ReadFile(dir.Sub(names[0])), bytes);  // kept for inspection
  // The next load is a fresh start.
  EXPECT_TRUE(store.Load().ok());
}

TEST(FileStateStoreTest, FailedSaveKeepsThePreviousFileAndIsCounted) {
  testing::ShortTempDir dir;
  FileStateStore store(dir.Sub("state.pb"));
  ASSERT_TRUE(store.Save(Sample()).ok());
  const std::string before = *ReadFile(dir.Sub("state.pb"));
  state::State changed = Sample();
  changed.add_allocations()->set_id(2);
  {
    FileSizeLimit full(before.size());  // the disk is "full" for the new file
    EXPECT_FALSE(store.Save(changed).ok());
  }
  EXPECT_EQ(*ReadFile(dir.Sub("state.pb")), before);
  EXPECT_THAT(Names(dir.path()), ::testing::ElementsAre("state.pb"));  // no temporary left
  EXPECT_EQ(store.save_failures(), 1);
  absl::StatusOr<state::State> s = store.Load();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->allocations_size(), 1);
}

TEST(MergeJournalTest, ADifferentAllocationUnderAKnownIdIsRenumberedNotDropped) {
  state::State snap;
  state::Allocation* a = snap.add_allocations();
  a->set_id(3);
  a->set_resource("vendor.com/gpu");
  a->add_device_ids("gpu-0");
  a->set_allocated_unix_ms(1000);
  snap.set_next_allocation_id(3);
  // The same record, annotated since: one copy.
  state::Allocation same = *a;
  same.clear_pod_name();
  // Another allocation that got id 3 too (a collision): kept, renumbered.
  state::Allocation other;
  other.set_id(3);
  other.set_resource("vendor.com/gpu");
  other.add_device_ids("gpu-1");
  other.set_allocated_unix_ms(2000);
  a->set_pod_name("pod-a");
  MergeJournal({same, other}, &snap);
  ASSERT_EQ(snap.allocations_size(), 2);
  EXPECT_EQ(snap.allocations(1).device_ids(0), "gpu-1");
  EXPECT_EQ(snap.allocations(1).id(), 4u);
  EXPECT_EQ(snap.next_allocation_id(), 4u);
}

// A reservation, then its answer or its withdrawal, replay in order onto a
// snapshot, whatever of them the snapshot already took in.
TEST(MergeJournalTest, ReservationsAreAnsweredOrWithdrawnInOrder) {
  auto reserved = [](uint64_t id, const char* device) {
    state::Allocation a;
    a.set_id(id);
    a.set_resource("vendor.com/gpu");
    a.add_device_ids(device);
    a.set_allocated_unix_ms(1000);
    a.set_stage(state::Allocation::RESERVED);
    return a;
  };
  auto answered = [](uint64_t id, const char* env) {
    state::Allocation a;
    a.set_id(id);
    a.set_stage(state::Allocation::ANSWERED);
    SetEnv(&a, "GPU", env);
    return a;
  };
  auto withdrawn = [](uint64_t id) {
    state::Allocation a;
    a.set_id(id);
    a.set_stage(state::Allocation::WITHDRAWN);
    return a;
  };
  // 1 answered; 2 withdrawn; 3 never answered (a power loss took it);
  // 9 an answer whose reservation a snapshot released already.
  state::State snap;
  MergeJournal({reserved(1, "gpu-0"), reserved(2, "gpu-1"), reserved(3, "gpu-2"),
                answered(1, "0"), withdrawn(2), answered(9, "9")},
               &snap);
  ASSERT_EQ(snap.allocations_size(), 2);
  EXPECT_EQ(snap.allocations(0).id(), 1u);
  EXPECT_EQ(snap.allocations(0).stage(), state::Allocation::WHOLE);
  EXPECT_EQ(ResponseOf(snap.allocations(0)).envs().at("GPU"), "0");
  EXPECT_EQ(snap.allocations(1).id(), 3u);
  EXPECT_EQ(snap.allocations(1).stage(), state::Allocation::RESERVED);
  EXPECT_EQ(snap.allocations(1).device_ids(0), "gpu-2");
  EXPECT_EQ(snap.next_allocation_id(), 9u);

  // A snapshot that holds 1 answered and annotated, and 3 quarantined: the
  // same records again change nothing and duplicate nothing.
  snap.mutable_allocations(0)->set_pod_name("pod-a");
  snap.mutable_allocations(1)->set_quarantined(true);
  const std::string before = snap.SerializeAsString();
  MergeJournal({reserved(1, "gpu-0"), reserved(3, "gpu-2"), answered(1, "0")}, &snap);
  EXPECT_EQ(snap.SerializeAsString(), before);

  // A reservation that collides with another allocation's id is
  // renumbered, and its answer follows it there.
  MergeJournal({reserved(3, "gpu-3"), answered(3, "3")}, &snap);
  ASSERT_EQ(snap.allocations_size(), 3);
  EXPECT_EQ(snap.allocations(1).stage(), state::Allocation::RESERVED);
  EXPECT_EQ(snap.allocations(2).id(), 10u);
  EXPECT_EQ(snap.allocations(2).device_ids(0), "gpu-3");
  EXPECT_EQ(ResponseOf(snap.allocations(2)).envs().at("GPU"), "3");
}

}  // namespace
}  // namespace dpproxy
