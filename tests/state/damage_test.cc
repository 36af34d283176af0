// The state directory damaged one way at a time, with ten acknowledged
// allocations in it: five taken into the newest snapshot, five in the
// journal since. Each case states how many a new StateKeeper loads without
// any help from the kubelet, and that no device is held by two of them.
// (What the kubelet's checkpoint gives back on top is
// tests/proxy/state_test.cc's LearnBackTest.)
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/state_dir.h"
#include "proxy/state/state_keeper.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;

constexpr char kGpu[] = "vendor.com/gpu";
constexpr size_t kStateHeader = 28;  // magic, version, length, checksum
constexpr size_t kJournalHeader = 8;

absl::Status RecordOne(StateKeeper& k, const std::string& device) {
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids(device);
  v1beta1::AllocateResponse resp;
  resp.add_container_responses()->mutable_envs()->insert({"DEV", device});
  return k.Record(kGpu, req, resp, "v1beta1", "/run/plugin.sock");
}

std::vector<state::Resource> Resources(int devices) {
  std::vector<state::Resource> out(1);
  out[0].set_name(kGpu);
  for (int i = 0; i < devices; ++i) {
    v1beta1::Device* d = out[0].add_devices();
    d->set_id(absl::StrCat("d", i));
    d->set_health("Healthy");
  }
  return out;
}

class DamageTest : public ::testing::Test {
 protected:
  // As a running dpproxy leaves it: a snapshot of the resources, then five
  // allocations taken into the next snapshot (a save after a resource
  // change), then five more in the journal.
  void SetUp() override {
    EventLog events("setup");
    StateKeeper k(Path("state.pb"), &events);
    ASSERT_TRUE(k.Load().ok());
    ASSERT_TRUE(k.SetResources(Resources(10)).ok());
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(RecordOne(k, absl::StrCat("d", i)).ok());
    ASSERT_TRUE(k.SetResources(Resources(11)).ok());  // the snapshot takes them in
    for (int i = 5; i < 10; ++i) ASSERT_TRUE(RecordOne(k, absl::StrCat("d", i)).ok());
    ASSERT_EQ(k.AllocationCount(), 10);
    for (const char* name : kFiles) {
      if (PathExists(Path(name))) saved_[name] = Read(name);
    }
  }

  // Back to the directory SetUp made, before each case of a test: a load
  // saves what it loaded, and moves damaged files aside.
  void Restore() {
    testing::RemoveTree(dir_.path());
    ASSERT_TRUE(MakeDirs(dir_.path()).ok());
    for (const auto& [name, bytes] : saved_) Write(name, bytes);
  }

  std::string Path(const std::string& name) const { return dir_.Sub(name); }
  std::string Read(const std::string& name) const { return *ReadFile(Path(name)); }
  void Write(const std::string& name, const std::string& bytes) {
    ASSERT_TRUE(WriteFileAtomic(Path(name), bytes).ok());
  }

  // Loads the directory as a new dpproxy would: the allocations' devices,
  // each checked to be held once.
  std::vector<std::string> Load() {
    StateKeeper k(Path("state.pb"), &events_);
    absl::StatusOr<state::State> s = k.Load();
    EXPECT_TRUE(s.ok()) << s.status();
    damaged_ = k.damaged_at_load();
    std::vector<std::string> devices;
    for (const state::Allocation& a : s->allocations()) {
      for (const std::string& d : a.device_ids()) devices.push_back(d);
    }
    std::sort(devices.begin(), devices.end());
    EXPECT_EQ(std::adjacent_find(devices.begin(), devices.end()), devices.end())
        << "a device is held twice";
    resources_ = s->resources_size() > 0 ? s->resources(0).devices_size() : 0;
    return devices;
  }

  static std::vector<std::string> Devices(int from, int to) {
    std::vector<std::string> out;
    for (int i = from; i < to; ++i) out.push_back(absl::StrCat("d", i));
    std::sort(out.begin(), out.end());
    return out;
  }

  static constexpr const char* kFiles[] = {"state.pb", "state.pb.prev", "journal.wal",
                                           "journal.wal.prev"};
  testing::ShortTempDir dir_;
  std::map<std::string, std::string> saved_;
  EventLog events_{"test"};
  bool damaged_ = false;
  int resources_ = 0;
};

TEST_F(DamageTest, AnIntactDirectoryLoadsEverything) {
  EXPECT_EQ(Load(), Devices(0, 10));
  EXPECT_FALSE(damaged_);
  EXPECT_EQ(resources_, 11);
}

TEST_F(DamageTest, ADamagedSnapshotFallsBackToThePreviousGenerationAndLosesNothing) {
  const std::string intact = Read("state.pb");
  struct Case {
    std::string name;
    std::string bytes;
  };
  std::vector<Case> cases;
  for (int tenths : {0, 3, 6, 9}) {
    cases.push_back({absl::StrCat("truncated to ", tenths, "/10"),
                     intact.substr(0, intact.size() * tenths / 10)});
  }
  std::string flipped = intact;
  flipped[kStateHeader + 3] ^= 0x04;
  cases.push_back({"a bit flipped in the payload", flipped});
  std::string version = intact;
  version[8] = 99;
  cases.push_back({"an unknown format version", version});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Restore();
    Write("state.pb", c.bytes);
    // dpctl verify says what a start will do, and reads what it will load.
    const StateDirReport report = InspectStateDir(dir_.path());
    EXPECT_TRUE(report.untrusted);
    ASSERT_FALSE(report.problems.empty());
    EXPECT_THAT(report.problems[0], HasSubstr("falls back to " + Path("state.pb.prev")));
    EXPECT_EQ(report.state.allocations_size(), 10);
    const size_t from = events_.Size();
    EXPECT_EQ(Load(), Devices(0, 10));
    EXPECT_TRUE(damaged_);  // and so the kubelet is asked too
    EXPECT_EQ(resources_, 10);  // the previous snapshot's device list
    std::optional<Json> e = events_.WaitForEvent("state_fell_back", {}, absl::ZeroDuration(), from);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ((*e)["records"], 5);
    EXPECT_EQ((*e)["journal_records"], 5);
    // The loaded state was saved whole: the next start needs no fallback.
    const size_t again = events_.Size();
    EXPECT_EQ(Load(), Devices(0, 10));
    EXPECT_FALSE(events_.WaitForEvent("state_fell_back", {}, absl::ZeroDuration(), again));
  }
}

// A snapshot removed while its previous generation stays is damage, not a
// first start: dpctl verify says so, and a start loads the previous
// generation and the journal, loses nothing, says so (state_missing) and
// learns back from the kubelet. A directory never used stays quiet.
TEST_F(DamageTest, ARemovedSnapshotIsDamageNotAFirstStart) {
  ASSERT_EQ(::unlink(Path("state.pb").c_str()), 0);
  const StateDirReport report = InspectStateDir(dir_.path());
  EXPECT_TRUE(report.untrusted);
  ASSERT_FALSE(report.problems.empty());
  EXPECT_THAT(report.problems[0], HasSubstr("is missing while its previous generation is there"));
  EXPECT_THAT(report.problems[0], HasSubstr("falls back to " + Path("state.pb.prev")));
  EXPECT_EQ(report.state.allocations_size(), 10);
  const size_t from = events_.Size();
  EXPECT_EQ(Load(), Devices(0, 10));
  EXPECT_TRUE(damaged_);
  EXPECT_TRUE(events_.WaitForEvent("state_missing", {}, absl::ZeroDuration(), from));

  testing::ShortTempDir fresh;
  EXPECT_TRUE(InspectStateDir(fresh.path()).problems.empty());
  EventLog quiet("fresh");
  StateKeeper k(fresh.Sub("state.pb"), &quiet);
  ASSERT_TRUE(k.Load().ok());
  EXPECT_FALSE(k.damaged_at_load());
  EXPECT_FALSE(quiet.WaitForEvent("state_missing", {}, absl::ZeroDuration()));
}

// A previous generation that cannot be read (EIO, permissions, a directory
// in its place) is not proof of damage: a start that must fall back to it
// refuses, naming it, rather than run on half the state; dpctl verify says
// dpproxy refuses to start.
TEST_F(DamageTest, AnUnreadablePreviousGenerationRefusesTheFallBack) {
  Write("state.pb", "not a state file");
  ASSERT_EQ(::unlink(Path("state.pb.prev").c_str()), 0);
  ASSERT_TRUE(MakeDirs(Path("state.pb.prev")).ok());
  const StateDirReport report = InspectStateDir(dir_.path());
  EXPECT_TRUE(report.refuses_start);
  ASSERT_FALSE(report.problems.empty());
  EXPECT_THAT(report.problems[0], HasSubstr("needs the previous generation, which cannot be read"));
  StateKeeper k(Path("state.pb"), &events_);
  absl::StatusOr<state::State> s = k.Load();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(Path("state.pb.prev")));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("refuses to start"));
}

TEST_F(DamageTest, BothSnapshotsDamagedKeepEveryJournaledRecord) {
  Write("state.pb", "not a state file");
  Write("state.pb.prev", "not a state file either");
  // The five taken into the damaged snapshot are in the previous
  // generation's records, the other five in the journal.
  EXPECT_EQ(Load(), Devices(0, 10));
  EXPECT_TRUE(damaged_);
  EXPECT_EQ(resources_, 0);  // device lists come back from the plugins
}

TEST_F(DamageTest, ADamagedJournalHeaderCostsNoRecord) {
  std::string journal = Read("journal.wal");
  journal[0] = 'X';
  journal[5] = 0;
  Write("journal.wal", journal);
  EXPECT_EQ(Load(), Devices(0, 10));
  EXPECT_TRUE(damaged_);
  std::optional<Json> e = events_.WaitForEvent("journal_damaged", {}, absl::ZeroDuration());
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ((*e)["header"], true);
  // Rewritten clean, with the damaged file kept aside.
  EXPECT_EQ(Read("journal.wal").substr(0, kJournalHeader), "DPPJRNL1");
  EXPECT_EQ(Load(), Devices(0, 10));
}

TEST_F(DamageTest, AFileWithNoIntactRecordIsNotAJournal) {
  Write("journal.wal", "XXXXXXXX and nothing that parses as a record");
  EXPECT_EQ(Load(), Devices(0, 5));  // the five since the snapshot are the kubelet's to tell
  EXPECT_TRUE(damaged_);
  EXPECT_TRUE(events_.WaitForEvent("state_untrusted", {}, absl::ZeroDuration()).has_value());
}

TEST_F(DamageTest, AnEmptiedJournalIsDamageNotAFreshStart) {
  Write("journal.wal", "");
  const StateDirReport report = InspectStateDir(dir_.path());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_THAT(report.problems[0], HasSubstr("missing or empty beside a saved snapshot"));
  EXPECT_EQ(Load(), Devices(0, 5));
  // Not silent: the records since the snapshot are learned back from the
  // kubelet (damaged_at_load starts that).
  EXPECT_TRUE(damaged_);
  EXPECT_TRUE(events_.WaitForEvent("journal_missing", {}, absl::ZeroDuration()).has_value());
}

TEST_F(DamageTest, DamagedRecordsCostThemselvesOnly) {
  const std::string intact = Read("journal.wal");
  absl::StatusOr<JournalContents> parsed = ParseJournal(intact);
  ASSERT_TRUE(parsed.ok());
  ASSERT_EQ(parsed->records.size(), 5u);
  // Record offsets: header, then (4-byte length, 8-byte checksum, payload).
  std::vector<size_t> at;
  size_t pos = kJournalHeader;
  for (const state::Allocation& a : parsed->records) {
    at.push_back(pos);
    pos += 12 + a.ByteSizeLong();
  }
  struct Case {
    std::string name;
    std::vector<std::pair<size_t, char>> flips;  // offset, xor
    size_t kept;
  };
  const std::vector<Case> cases = {
      {"payload", {{at[1] + 14, 0x10}}, 9},
      {"length field", {{at[2], 0x7f}}, 9},
      {"checksum", {{at[3] + 5, 0x01}}, 9},
      {"two records", {{at[1] + 14, 0x10}, {at[3] + 14, 0x10}}, 8},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string bytes = intact;
    for (const auto& [offset, x] : c.flips) bytes[offset] ^= x;
    Restore();
    Write("journal.wal", bytes);
    EXPECT_EQ(Load().size(), c.kept);
    EXPECT_TRUE(damaged_);
  }
  // Zeroed: a record overwritten with zeros in the middle.
  std::string zeroed = intact;
  std::fill(zeroed.begin() + at[2], zeroed.begin() + at[3], '\0');
  Restore();
  Write("journal.wal", zeroed);
  EXPECT_EQ(Load().size(), 9u);
}

TEST_F(DamageTest, ATornLastRecordWasNeverAcknowledgedAndIsCut) {
  std::string journal = Read("journal.wal");
  absl::StatusOr<JournalContents> parsed = ParseJournal(journal);
  ASSERT_TRUE(parsed.ok());
  // An eleventh record, cut in the middle of its payload.
  journal.resize(parsed->valid_bytes);
  state::Allocation torn = parsed->records.back();
  torn.set_id(torn.id() + 1);
  std::string record = JournalFile::Encode({torn});
  journal += record.substr(0, record.size() / 2);
  Write("journal.wal", journal);
  EXPECT_EQ(Load(), Devices(0, 10));
  EXPECT_FALSE(damaged_);  // a crash, not damage
}

TEST_F(DamageTest, AReleaseIsCarriedByThePreviousGenerationToo) {
  // d0's pod ends and a new pod gets d0, both after the previous snapshot:
  // a fallback must not bring the ended allocation back beside the new one.
  {
    StateKeeper k(Path("state.pb"), &events_);
    ASSERT_TRUE(k.Load().ok());
    uint64_t d0 = 0;
    k.ForEachAllocation([&d0](const state::Allocation& a) {
      if (a.device_ids(0) == "d0") d0 = a.id();
    });
    ASSERT_NE(d0, 0u);
    ASSERT_TRUE(k.Release({d0}).ok());  // saves: the previous snapshot still holds it
    ASSERT_TRUE(RecordOne(k, "d0").ok());
  }
  Write("state.pb", "damaged");
  EXPECT_EQ(Load(), Devices(0, 10));  // d0 once: held twice fails inside Load()
}

TEST_F(DamageTest, ThePreviousGenerationFollowsEverySave) {
  // Five more saves, each taking in one more allocation: the fallback
  // still holds every one of them.
  {
    StateKeeper k(Path("state.pb"), &events_);
    ASSERT_TRUE(k.Load().ok());
    for (int i = 10; i < 15; ++i) {
      ASSERT_TRUE(RecordOne(k, absl::StrCat("d", i)).ok());
      ASSERT_TRUE(k.SetResources(Resources(12 + i)).ok());
    }
  }
  Write("state.pb", "damaged");
  EXPECT_EQ(Load(), Devices(0, 15));
  EXPECT_EQ(resources_, 12 + 13);  // the list before the last save
}

}  // namespace
}  // namespace dpproxy
