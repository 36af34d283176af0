#include "proxy/state/state_keeper.h"

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
v1beta1::AllocateRequest TwoContainers(const char* a, const char* b) {
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids(a);
  req.add_container_requests()->add_devices_ids(b);
  return req;
}

v1beta1::AllocateResponse TwoResponses() {
  v1beta1::AllocateResponse resp;
  resp.add_container_responses();
  resp.add_container_responses();
  return resp;
}

absl::Status RecordTwo(StateKeeper& keeper, const char* a, const char* b) {
  return keeper.Record("vendor.com/gpu", TwoContainers(a, b), TwoResponses(), "v1beta1", "/s");
}

std::vector<state::Resource> OneResource() {
  std::vector<state::Resource> rs(1);
  rs[0].set_name("vendor.com/gpu");
  return rs;
}


// Load() that must succeed.
state::State MustLoad(StateKeeper& keeper) {
  absl::StatusOr<state::State> s = keeper.Load();
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : state::State();
}

// A resource's devices are saved from the bytes of its published list,
// held shared (not copied) by the keeper, and read back from the state
// file as the resource's devices.
TEST(StateKeeperTest, SavedDevicesComeFromTheListsOwnBytes) {
  testing::ShortTempDir dir;
  v1beta1::ListAndWatchResponse list;
  for (int i = 0; i < 3; ++i) {
    v1beta1::Device* d = list.add_devices();
    d->set_id(absl::StrCat("gpu-", i));
    d->set_health(i == 1 ? "Unhealthy" : "Healthy");
    if (i == 2) d->mutable_topology()->add_nodes()->set_id(1);
  }
  auto wire = std::make_shared<const std::string>(list.SerializeAsString());
  state::Resource head;
  head.set_name("vendor.com/gpu");
  head.set_kubelet_api("v1beta1");
  EventLog events("test");
  {
    StateKeeper keeper(dir.Sub("state.pb"), &events);
    MustLoad(keeper);
    ASSERT_TRUE(keeper.SetResourcesToSave({{head.SerializeAsString(), wire}}).ok());
    EXPECT_EQ(wire.use_count(), 2);  // the keeper's is the same bytes
  }
  StateKeeper again(dir.Sub("state.pb"), &events);
  MustLoad(again);
  const state::State st = again.Snapshot();
  ASSERT_EQ(st.resources_size(), 1);
  EXPECT_EQ(st.resources(0).name(), "vendor.com/gpu");
  ASSERT_EQ(st.resources(0).devices_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(st.resources(0).devices(i).SerializeAsString(), list.devices(i).SerializeAsString())
        << i;
  }
  // After a start, the same devices from a plugin's new list are no
  // change: nothing is saved, and the keeper holds that list's bytes
  // instead of the copy it loaded.
  const std::string file_before = *ReadFile(dir.Sub("state.pb"));
  auto relisted = std::make_shared<const std::string>(*wire);
  ASSERT_TRUE(again.SetResourcesToSave({{head.SerializeAsString(), relisted}}).ok());
  EXPECT_EQ(*ReadFile(dir.Sub("state.pb")), file_before);
  EXPECT_EQ(relisted.use_count(), 2);
  // A health change is saved.
  list.mutable_devices(0)->set_health("Unhealthy");
  auto flipped = std::make_shared<const std::string>(list.SerializeAsString());
  ASSERT_TRUE(again.SetResourcesToSave({{head.SerializeAsString(), flipped}}).ok());
  EXPECT_NE(*ReadFile(dir.Sub("state.pb")), file_before);
  EXPECT_EQ(again.Snapshot().resources(0).devices(0).health(), "Unhealthy");
}

// Records one allocation of two containers per pair, in a fresh keeper that
// is then closed: the state directory holds them in its journal.
void JournalPairs(const std::string& dir, EventLog& events,
                  const std::vector<std::pair<const char*, const char*>>& pairs) {
  StateKeeper keeper(dir + "/state.pb", &events);
  MustLoad(keeper);
  for (const auto& [a, b] : pairs) ASSERT_TRUE(RecordTwo(keeper, a, b).ok());
}

TEST(StateKeeperTest, RecordGoesToTheJournalAndSurvivesReload) {
  testing::ShortTempDir dir;
  EventLog events("test");
  {
    StateKeeper keeper(dir.Sub("state.pb"), &events);
    MustLoad(keeper);
    ASSERT_TRUE(RecordTwo(keeper, "a", "b").ok());
    EXPECT_EQ(keeper.Snapshot().allocations_size(), 2);
  }
  // Only the journal has them (no snapshot was needed for a Record).
  absl::StatusOr<std::string> journal = ReadFile(dir.Sub("journal.wal"));
  ASSERT_TRUE(journal.ok());
  absl::StatusOr<JournalContents> parsed = ParseJournal(*journal);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->records.size(), 2u);
  absl::StatusOr<state::State> read = ReadStateDir(dir.path());
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->allocations_size(), 2);
  // A new keeper replays it, folds it into a snapshot, and keeps the ids.
  StateKeeper reloaded(dir.Sub("state.pb"), &events);
  state::State s = MustLoad(reloaded);
  ASSERT_EQ(s.allocations_size(), 2);
  EXPECT_EQ(s.allocations(1).device_ids(0), "b");
  EXPECT_EQ(s.next_allocation_id(), 2u);
  ASSERT_TRUE(RecordTwo(reloaded, "c", "d").ok());
  EXPECT_EQ(reloaded.Snapshot().allocations(3).id(), 4u);
}

// `bytes` (a journal) with the first `n` bytes of its first record written
// again right after its last record, as an append torn by a crash leaves
// them, and the rest of the file as it was.
// The first `n` bytes of the journal's first record, as a crash mid-append
// leaves them. Its last byte is made non-zero: a torn tail that ends in
// zeros is read as space written ahead up to its last non-zero byte (the
// record's checksum bytes vary from run to run), and the cut would count
// fewer bytes.
std::string TornFragment(const std::string& bytes, size_t n) {
  std::string frag = bytes.substr(8, n);
  if (frag.back() == '\0') frag.back() = '\x01';
  return frag;
}

std::string WithTornRecord(const std::string& bytes, size_t n) {
  const size_t end = ParseJournal(bytes)->valid_bytes;
  std::string out = bytes;
  if (out.size() < end + n) out.resize(end + n, '\0');
  out.replace(end, n, TornFragment(bytes, n));
  return out;
}

TEST(StateKeeperTest, FailedJournalWriteRecordsNothing) {
  testing::ShortTempDir dir;
  EventLog events("test");
  StateKeeper keeper(dir.Sub("state.pb"), &events);
  MustLoad(keeper);
  {
    // Too little room to write space ahead: the records go in alone.
    FileSizeLimit small(4096);
    ASSERT_TRUE(RecordTwo(keeper, "a", "b").ok());
  }
  const std::string before = *ReadFile(dir.Sub("journal.wal"));
  ASSERT_LT(before.size(), 4096u);
  {
    FileSizeLimit full(before.size() + 10);  // the disk is "full"
    absl::Status s = RecordTwo(keeper, "c", "d");
    EXPECT_FALSE(s.ok());
  }
  EXPECT_EQ(keeper.Snapshot().allocations_size(), 2);  // nothing half-recorded
  EXPECT_EQ(*ReadFile(dir.Sub("journal.wal")), before);  // cut back
  EXPECT_TRUE(events.WaitForEvent("state_save_failed", {}, absl::Seconds(1)).has_value());
  // Counted and visible: a refused Allocate is a failed write.
  EXPECT_EQ(keeper.save_failures(), 1);
  EXPECT_FALSE(keeper.writable());
  EXPECT_THAT(keeper.last_write_error(), HasSubstr("journal.wal"));
  ASSERT_TRUE(RecordTwo(keeper, "e", "f").ok());  // space again
  EXPECT_TRUE(keeper.writable());
  EXPECT_EQ(keeper.save_failures(), 1);
  StateKeeper reloaded(dir.Sub("state.pb"), &events);
  EXPECT_EQ(MustLoad(reloaded).allocations_size(), 4);
}

// Makes the next open() fail with EMFILE (a real, transient kernel error)
// for the lifetime of the object.
class NoFreeDescriptors {
 public:
  NoFreeDescriptors() {
    getrlimit(RLIMIT_NOFILE, &old_);
    const int lowest_free = ::dup(0);
    ::close(lowest_free);
    struct rlimit lim = old_;
    lim.rlim_cur = static_cast<rlim_t>(lowest_free);
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  ~NoFreeDescriptors() { setrlimit(RLIMIT_NOFILE, &old_); }

 private:
  struct rlimit old_;
};

TEST(StateKeeperTest, TransientReadErrorStopsStartAndChangesNothing) {
  testing::ShortTempDir dir;
  EventLog events("test");
  {
    StateKeeper keeper(dir.Sub("state.pb"), &events);
    MustLoad(keeper);
    ASSERT_TRUE(RecordTwo(keeper, "a", "b").ok());
    ASSERT_TRUE(keeper.SetResources(OneResource()).ok());
  }
  const std::string before = *ReadFile(dir.Sub("state.pb"));
  {
    StateKeeper keeper(dir.Sub("state.pb"), &events);
    absl::StatusOr<state::State> s;
    {
      NoFreeDescriptors emfile;
      s = keeper.Load();
    }
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("Too many open files"));
  }
  // Not moved aside, not overwritten: the next start loads it whole.
  EXPECT_THAT(Names(dir.path()),
              ::testing::UnorderedElementsAre("state.pb", "journal.wal", "journal.wal.prev"));
  EXPECT_EQ(*ReadFile(dir.Sub("state.pb")), before);
  StateKeeper reloaded(dir.Sub("state.pb"), &events);
  EXPECT_EQ(MustLoad(reloaded).allocations_size(), 2);
}

TEST(StateKeeperTest, DirectoryOrLinkInPlaceOfAFileStopsStart) {
  for (const char* name : {"state.pb", "journal.wal"}) {
    for (bool link : {false, true}) {
      SCOPED_TRACE(std::string(name) + (link ? " as a link" : " as a directory"));
      testing::ShortTempDir dir;
      testing::ShortTempDir elsewhere;
      const std::string target = elsewhere.Sub("victim");
      ASSERT_TRUE(WriteFileAtomic(target, "precious").ok());
      if (link) {
        ASSERT_EQ(::symlink(target.c_str(), dir.Sub(name).c_str()), 0);
      } else {
        ASSERT_EQ(::mkdir(dir.Sub(name).c_str(), 0700), 0);
      }
      EventLog events("test");
      StateKeeper keeper(dir.Sub("state.pb"), &events);
      absl::StatusOr<state::State> s = keeper.Load();
      ASSERT_FALSE(s.ok());
      EXPECT_THAT(std::string(s.status().message()),
                  HasSubstr(link ? "symbolic link" : "directory"));
      EXPECT_EQ(*ReadFile(target), "precious");  // never written through
      EXPECT_TRUE(PathExists(dir.Sub(name)));     // never moved or removed
      StateDirReport report = InspectStateDir(dir.path());
      EXPECT_TRUE(report.refuses_start);
    }
  }
}

TEST(StateKeeperTest, DamageInTheMiddleOfTheJournalKeepsLaterRecords) {
  testing::ShortTempDir dir;
  EventLog events("test");
  JournalPairs(dir.path(), events, {{"a", "b"}, {"c", "d"}, {"e", "f"}});
  std::string bytes = *ReadFile(dir.Sub("journal.wal"));
  absl::StatusOr<JournalContents> intact = ParseJournal(bytes);
  ASSERT_TRUE(intact.ok());
  ASSERT_EQ(intact->records.size(), 6u);
  // Flip a byte inside the second record's payload: records 3..6 are intact
  // and were acknowledged; they must not be taken for a torn tail.
  const size_t first = 8 + 12 + intact->records[0].ByteSizeLong();
  bytes[first + 14] ^= 0x20;
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("journal.wal"), bytes).ok());
  absl::StatusOr<JournalContents> parsed = ParseJournal(bytes);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->records.size(), 5u);
  EXPECT_EQ(parsed->cut_bytes, 0u);
  EXPECT_GT(parsed->damaged_bytes, 0u);
  // dpctl verify sees it before dpproxy does.
  StateDirReport report = InspectStateDir(dir.path());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_THAT(report.problems[0], HasSubstr("is damaged: "));
  EXPECT_EQ(report.state.allocations_size(), 5);

  StateKeeper reloaded(dir.Sub("state.pb"), &events);
  state::State s = MustLoad(reloaded);
  std::vector<std::string> devices;
  for (const auto& a : s.allocations()) devices.push_back(a.device_ids(0));
  EXPECT_THAT(devices, ::testing::ElementsAre("a", "c", "d", "e", "f"));
  std::optional<Json> e = events.WaitForEvent("journal_damaged", {}, absl::Seconds(1));
  ASSERT_TRUE(e.has_value());
  const std::string copy = (*e)["copy"];
  EXPECT_EQ(*ReadFile(copy), bytes);  // the damaged file is kept for inspection
  EXPECT_FALSE(events.WaitForEvent("journal_torn_tail", {}, absl::Milliseconds(1)).has_value());
  // The rewritten journal is clean, and new records follow the old ids.
  EXPECT_TRUE(InspectStateDir(dir.path()).problems.empty());
  ASSERT_TRUE(RecordTwo(reloaded, "g", "h").ok());
  EXPECT_EQ(reloaded.Snapshot().allocations(5).id(), 7u);
}

TEST(StateKeeperTest, TornTailIsReportedByInspection) {
  testing::ShortTempDir dir;
  EventLog events("test");
  JournalPairs(dir.path(), events, {{"a", "b"}});
  std::string bytes = *ReadFile(dir.Sub("journal.wal"));
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("journal.wal"), WithTornRecord(bytes, 15)).ok());
  StateDirReport report = InspectStateDir(dir.path());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_THAT(report.problems[0], HasSubstr("torn record"));
  EXPECT_FALSE(report.refuses_start);
}

// A device held by a forgotten (quarantined) allocation is never journaled
// for a second holder, whatever the kubelet asks; the refusal names the
// holder.
TEST(StateKeeperTest, ForgottenDevicesAreNeverJournaledTwice) {
  testing::ShortTempDir dir;
  EventLog events("test");
  StateKeeper keeper(dir.Sub("state.pb"), &events);
  MustLoad(keeper);
  ASSERT_TRUE(RecordTwo(keeper, "a", "b").ok());
  ASSERT_TRUE(keeper.Quarantine({1}, "test").ok());
  absl::Status s = RecordTwo(keeper, "c", "a");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("device a of vendor.com/gpu is still in use by allocation 1"));
  EXPECT_TRUE(events.WaitForEvent("device_held_twice", {{"device", "a"}}, absl::Seconds(1)));
  EXPECT_EQ(keeper.AllocationCount(), 2);  // nothing journaled
  ASSERT_TRUE(RecordTwo(keeper, "c", "d").ok());  // others still fine
  // The hold survives a restart and keeps refusing.
  StateKeeper reloaded(dir.Sub("state.pb"), &events);
  MustLoad(reloaded);
  EXPECT_EQ(RecordTwo(reloaded, "a", "e").code(), absl::StatusCode::kFailedPrecondition);
  // Released (the pod is gone): the device may be allocated again.
  ASSERT_TRUE(reloaded.Release({1}).ok());
  EXPECT_TRUE(RecordTwo(reloaded, "a", "e").ok());
}

TEST(StateFileModesTest, StateAndJournalAre0600WhateverTheUmask) {
  testing::ShortTempDir dir;
  EventLog events("test");
  const mode_t old = ::umask(0);
  {
    StateKeeper keeper(dir.Sub("state.pb"), &events);
    MustLoad(keeper);
    ASSERT_TRUE(keeper.SetResources(OneResource()).ok());
  }
  ::umask(old);
  struct stat st;
  ASSERT_EQ(::stat(dir.Sub("state.pb").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(::stat(dir.Sub("journal.wal").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST(StateKeeperTest, TornJournalTailIsCutAndTheRestKept) {
  testing::ShortTempDir dir;
  EventLog events("test");
  JournalPairs(dir.path(), events, {{"a", "b"}});
  // A crash in the middle of the next append leaves half a record, in the
  // space written ahead (and, in a journal written before there was any,
  // at the end of the file).
  const std::string bytes = *ReadFile(dir.Sub("journal.wal"));
  const size_t end = ParseJournal(bytes)->valid_bytes;
  ASSERT_GT(bytes.size(), end) << "no space written ahead";
  for (const std::string& torn :
       {WithTornRecord(bytes, 9), bytes.substr(0, end) + TornFragment(bytes, 9)}) {
    ASSERT_TRUE(WriteFileAtomic(dir.Sub("journal.wal"), torn).ok());
    EventLog log("test");
    StateKeeper reloaded(dir.Sub("state.pb"), &log);
    EXPECT_EQ(MustLoad(reloaded).allocations_size(), 2);
    EXPECT_TRUE(log.WaitForEvent("journal_torn_tail", {{"bytes", 9}}, absl::Seconds(1)));
  }
}

// Appends overwrite space the journal already has (so that their fdatasync
// writes no size); that space is not a torn record, survives a reload, and
// later records land in it, right after the last one.
TEST(StateKeeperTest, JournalSpaceWrittenAheadIsCleanAndFilledInOrder) {
  testing::ShortTempDir dir;
  EventLog events("test");
  {
    StateKeeper keeper(dir.Sub("state.pb"), &events);
    MustLoad(keeper);
    ASSERT_TRUE(RecordTwo(keeper, "a", "b").ok());
  }
  const std::string bytes = *ReadFile(dir.Sub("journal.wal"));
  absl::StatusOr<JournalContents> parsed = ParseJournal(bytes);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->records.size(), 2u);
  EXPECT_EQ(parsed->cut_bytes, 0u);
  EXPECT_GE(bytes.size(), size_t{1} << 20);
  EXPECT_EQ(parsed->preallocated_bytes, bytes.size() - parsed->valid_bytes);
  EXPECT_TRUE(InspectStateDir(dir.path()).problems.empty());
  StateKeeper reloaded(dir.Sub("state.pb"), &events);
  EXPECT_EQ(MustLoad(reloaded).allocations_size(), 2);
  EXPECT_FALSE(events.WaitForEvent("journal_torn_tail", {}, absl::Milliseconds(1)).has_value());
  // Loading took a and b into the snapshot; c and d go into the journal's
  // space, and the file does not grow.
  ASSERT_TRUE(RecordTwo(reloaded, "c", "d").ok());
  ASSERT_TRUE(RecordTwo(reloaded, "e", "f").ok());
  const std::string after = *ReadFile(dir.Sub("journal.wal"));
  EXPECT_EQ(after.size(), bytes.size());
  parsed = ParseJournal(after);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->cut_bytes, 0u);
  ASSERT_GE(parsed->records.size(), 4u);
  EXPECT_EQ(parsed->records[parsed->records.size() - 4].device_ids(0), "c");
  EXPECT_EQ(parsed->records.back().device_ids(0), "f");
  StateKeeper again(dir.Sub("state.pb"), &events);
  EXPECT_EQ(MustLoad(again).allocations_size(), 6);
}

// A disk with room for a record but not for space ahead of it takes the
// record; space is written ahead again once there is room, and never over
// a record.
TEST(StateKeeperTest, NoRoomForSpaceAheadStillRecords) {
  testing::ShortTempDir dir;
  EventLog events("test");
  StateKeeper keeper(dir.Sub("state.pb"), &events);
  MustLoad(keeper);
  {
    FileSizeLimit small(4096);
    for (const char* d : {"a", "c", "e"}) ASSERT_TRUE(RecordTwo(keeper, d, "x").ok());
  }
  const std::string tight = *ReadFile(dir.Sub("journal.wal"));
  EXPECT_LT(tight.size(), 4096u);
  ASSERT_TRUE(RecordTwo(keeper, "g", "y").ok());
  const std::string roomy = *ReadFile(dir.Sub("journal.wal"));
  EXPECT_GE(roomy.size(), size_t{1} << 20);
  EXPECT_EQ(roomy.substr(0, tight.size()), tight);  // nothing before overwritten
  absl::StatusOr<JournalContents> parsed = ParseJournal(roomy);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->records.size(), 8u);
  EXPECT_EQ(parsed->cut_bytes, 0u);
}

TEST(StateKeeperTest, JournalRecordsAlsoInTheSnapshotAreNotDuplicated) {
  testing::ShortTempDir dir;
  EventLog events("test");
  std::string journal;
  {
    StateKeeper keeper(dir.Sub("state.pb"), &events);
    MustLoad(keeper);
    ASSERT_TRUE(RecordTwo(keeper, "a", "b").ok());
    journal = *ReadFile(dir.Sub("journal.wal"));
    // A snapshot save folds the journal in and empties it...
    ASSERT_TRUE(keeper.SetResources(OneResource()).ok());
  }
  // ... but a crash right before the journal was emptied leaves both.
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("journal.wal"), journal).ok());
  StateKeeper reloaded(dir.Sub("state.pb"), &events);
  EXPECT_EQ(MustLoad(reloaded).allocations_size(), 2);
}

TEST(StateKeeperTest, UnchangedResourcesAreNotRewritten) {
  testing::ShortTempDir dir;
  EventLog events("test");
  StateKeeper keeper(dir.Sub("state.pb"), &events);
  MustLoad(keeper);
  ASSERT_TRUE(keeper.SetResources(OneResource()).ok());
  std::optional<FileId> first = StatFileId(dir.Sub("state.pb"));
  ASSERT_TRUE(keeper.SetResources(OneResource()).ok());
  EXPECT_EQ(StatFileId(dir.Sub("state.pb")), first);  // not rewritten
}

// The keeper holds saved device lists serialized, and writes each as a
// `resources` entry followed by its time: the file must read back, with any
// protobuf reader, as the State that was saved, times included.
TEST(StateKeeperTest, SavedResourcesReadBackWhole) {
  testing::ShortTempDir dir;
  EventLog events("test");
  std::vector<state::Resource> rs(2);
  rs[0].set_name("vendor.com/nic");
  rs[0].set_kubelet_api("v1beta1");
  rs[1].set_name("vendor.com/gpu");
  rs[1].mutable_backend()->set_endpoint("/run/gpu.sock");
  for (int i = 0; i < 300; ++i) {  // longer than a one-byte length
    v1beta1::Device* d = rs[1].add_devices();
    d->set_id(absl::StrCat("GPU-", i));
    d->set_health(i % 2 ? "Healthy" : "Unhealthy");
  }
  const int64_t before = absl::ToUnixMillis(absl::Now());
  {
    StateKeeper keeper(dir.Sub("state.pb"), &events);
    MustLoad(keeper);
    ASSERT_TRUE(RecordTwo(keeper, "a", "b").ok());
    ASSERT_TRUE(keeper.SetResources(rs).ok());
    const state::State mine = keeper.Snapshot();
    ASSERT_EQ(mine.resources_size(), 2);
    EXPECT_EQ(mine.resources(0).name(), "vendor.com/gpu");  // sorted by name
  }
  absl::StatusOr<std::string> bytes = ReadFile(dir.Sub("state.pb"));
  ASSERT_TRUE(bytes.ok());
  absl::StatusOr<state::State> file = DecodeStateFile(*bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->resources_size(), 2);
  const state::Resource& gpu = file->resources(0);
  EXPECT_EQ(gpu.name(), "vendor.com/gpu");
  EXPECT_EQ(gpu.backend().endpoint(), "/run/gpu.sock");
  ASSERT_EQ(gpu.devices_size(), 300);
  EXPECT_EQ(gpu.devices(299).id(), "GPU-299");
  EXPECT_EQ(gpu.devices(299).health(), "Healthy");
  EXPECT_GE(gpu.updated_unix_ms(), before);
  EXPECT_EQ(file->resources(1).kubelet_api(), "v1beta1");
  EXPECT_EQ(file->resources(1).updated_unix_ms(), gpu.updated_unix_ms());
  StateKeeper reloaded(dir.Sub("state.pb"), &events);
  const state::State loaded = MustLoad(reloaded);
  EXPECT_EQ(loaded.allocations_size(), 2);
  ASSERT_EQ(loaded.resources_size(), 2);
  EXPECT_EQ(loaded.resources(0).SerializeAsString(), gpu.SerializeAsString());
}

// Reconciliation's copy leaves out the response (most of an allocation's
// size) and nothing else. Every field of the fixture is set, checked by
// reflection, so a field added to Allocation but not to the copy fails here.
TEST(StateKeeperTest, AllocationsSnapshotCopiesEveryFieldButTheResponse) {
  testing::ShortTempDir dir;
  EventLog events{"test"};
  state::State saved;
  saved.set_next_allocation_id(8);
  state::Allocation* a = saved.add_allocations();
  a->set_id(7);
  a->set_resource("vendor.com/gpu");
  a->add_device_ids("gpu-0");
  a->add_device_ids("gpu-1");
  SetEnv(a, "GPU", "0,1");
  a->set_backend_api("v1beta1");
  a->set_backend_endpoint("/run/gpu.sock");
  a->set_allocated_unix_ms(1700000000000);
  a->set_pod_namespace("ns");
  a->set_pod_name("pod");
  a->set_container("main");
  a->set_quarantined(true);
  a->set_quarantine_reason("lost by the kubelet");
  a->set_quarantined_unix_ms(1700000000001);
  a->set_pod_uid("uid-1");
  a->set_backend_resource("legacy.com/gpu");
  a->add_backend_device_ids("GPU-aa");
  a->add_backend_device_ids("GPU-bb");
  a->set_stage(state::Allocation::RESERVED);
  a->mutable_claim()->set_uid("5f0c4a2e-1d2b-4c3d-8e9f-0a1b2c3d4e5f");
  const google::protobuf::Reflection* refl = a->GetReflection();
  const google::protobuf::Descriptor* desc = a->GetDescriptor();
  for (int i = 0; i < desc->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = desc->field(i);
    if (f->is_repeated()) {
      EXPECT_GT(refl->FieldSize(*a, f), 0) << "the fixture leaves out " << f->name();
    } else {
      EXPECT_TRUE(refl->HasField(*a, f)) << "the fixture leaves out " << f->name();
    }
  }
  ASSERT_TRUE(FileStateStore(dir.Sub("state.pb")).Save(saved).ok());
  StateKeeper keeper(dir.Sub("state.pb"), &events);
  MustLoad(keeper);
  const state::State copy = keeper.AllocationsSnapshot();
  ASSERT_EQ(copy.allocations_size(), 1);
  state::Allocation want = *a;
  want.clear_response();
  EXPECT_EQ(copy.allocations(0).SerializeAsString(), want.SerializeAsString());
  EXPECT_EQ(copy.next_allocation_id(), 8u);
}

// Two allocations saved under one id (a file written by hand, or by a
// defect): both are held after a start, the later one under a fresh id,
// and both hold their devices.
TEST(StateKeeperTest, AllocationsSharingAnIdAreBothKept) {
  testing::ShortTempDir dir;
  EventLog events{"test"};
  state::State saved = Sample();
  state::Allocation* twin = saved.add_allocations();
  *twin = saved.allocations(0);
  twin->set_device_ids(0, "gpu-1");
  ASSERT_TRUE(FileStateStore(dir.Sub("state.pb")).Save(saved).ok());
  StateKeeper keeper(dir.Sub("state.pb"), &events);
  MustLoad(keeper);
  const state::State st = keeper.Snapshot();
  ASSERT_EQ(st.allocations_size(), 2);
  EXPECT_EQ(st.allocations(0).id(), 1u);
  EXPECT_EQ(st.allocations(0).device_ids(0), "gpu-0");
  EXPECT_EQ(st.allocations(1).id(), 2u);
  EXPECT_EQ(st.allocations(1).device_ids(0), "gpu-1");
  EXPECT_EQ(st.next_allocation_id(), 2u);
  EXPECT_TRUE(keeper.HoldsDevice("vendor.com/gpu", "gpu-0"));
  EXPECT_TRUE(keeper.HoldsDevice("vendor.com/gpu", "gpu-1"));
}

// DRA mode: a claim's allocations are found by its UID, with what its
// answer added, after a reload too, and no more once released.
TEST(StateKeeperTest, AClaimsAllocationsAreFoundByItsUid) {
  testing::ShortTempDir dir;
  EventLog events{"test"};
  std::vector<state::DraClaim> claims(2);
  claims[0].set_uid("claim-a");
  claims[1].set_uid("claim-b");
  auto reserve = [&](StateKeeper& keeper, const char* d0, const char* d1) {
    absl::Notification durable;
    const AllocationJournal::Reservation r = keeper.ReserveAsync(
        "vendor.com/gpu", TwoContainers(d0, d1),
        BackendSide{"v1beta1", "/s", "vendor.com/gpu", nullptr, &claims}, [&](absl::Status s) {
          EXPECT_TRUE(s.ok()) << s;
          durable.Notify();
        });
    EXPECT_TRUE(durable.WaitForNotificationWithTimeout(absl::Seconds(10)));
    return r;
  };
  std::vector<uint64_t> ids;
  {
    StateKeeper keeper(dir.Sub("state.pb"), &events);
    MustLoad(keeper);
    const AllocationJournal::Reservation first = reserve(keeper, "gpu-0", "gpu-1");
    reserve(keeper, "gpu-2", "gpu-3");
    std::vector<state::DraClaim> answered = claims;
    answered[0].add_cdi_ids("vendor.com/gpu=gpu-0");
    absl::Notification done;
    keeper.AnswerAsync(first, TwoResponses(), [&](absl::Status s) {
      EXPECT_TRUE(s.ok()) << s;
      done.Notify();
    }, &answered);
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    const std::vector<state::Allocation> a = keeper.ClaimAllocations("claim-a");
    ASSERT_EQ(a.size(), 2u);
    EXPECT_EQ(a[0].device_ids(0), "gpu-0");
    EXPECT_EQ(a[0].claim().cdi_ids(0), "vendor.com/gpu=gpu-0");
    EXPECT_EQ(a[1].device_ids(0), "gpu-2");
    EXPECT_TRUE(keeper.ClaimAllocations("claim-c").empty());
    EXPECT_EQ(keeper.Claims().size(), 2u);
    for (const state::Allocation& x : a) ids.push_back(x.id());
  }
  StateKeeper again(dir.Sub("state.pb"), &events);
  MustLoad(again);
  ASSERT_EQ(again.ClaimAllocations("claim-a").size(), 2u);
  EXPECT_EQ(again.ClaimAllocations("claim-a")[0].claim().cdi_ids(0), "vendor.com/gpu=gpu-0");
  ASSERT_TRUE(again.Release(ids).ok());
  EXPECT_TRUE(again.ClaimAllocations("claim-a").empty());
  const auto left = again.Claims();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left.begin()->first, "claim-b");
  EXPECT_EQ(left.begin()->second.size(), 2u);
}

// dpproxy serving both as device plugins and through DRA: each device has
// one holder. When a claim and a pod of the extended resource ask for the
// same device at the same instant, one gets it and the other is refused
// with the winner named; never both. After a restart each still holds its
// device. Serving one way only, each path keeps its own rules (a newer
// allocation supersedes an older one).
TEST(StateKeeperTest, ADeviceHasOneHolderAcrossTheTwoPaths) {
  testing::ShortTempDir dir;
  EventLog events{"test"};
  std::vector<state::DraClaim> claims(1);
  claims[0].set_uid("claim-a");
  claims[0].set_namespace_("default");
  claims[0].set_name("train");
  std::map<std::string, bool> claim_won;  // device -> whether the claim got it
  auto one = [](const std::string& device) {
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids(device);
    return req;
  };
  // A reservation's outcome, once durable or refused.
  auto reserve = [&](StateKeeper& keeper, const std::string& resource, const std::string& device,
                     bool claim) {
    absl::Notification done;
    absl::Status out;
    keeper.ReserveAsync(resource, one(device),
                        BackendSide{"v1beta1", "/s", resource, nullptr, claim ? &claims : nullptr},
                        [&](absl::Status s) {
                          out = s;
                          done.Notify();
                        });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    return out;
  };
  {
    StateKeeper keeper(dir.Sub("state.pb"), &events);
    MustLoad(keeper);
    keeper.SetOneHolderAcrossPaths(true);
    for (int round = 0; round < 100; ++round) {
      const std::string device = absl::StrCat("gpu-", round);
      absl::Status by_claim, by_pod;
      std::atomic<int> ready{0};
      auto go = [&](bool claim, absl::Status* out) {
        ready.fetch_add(1);
        while (ready.load() < 2) {
        }  // both ask at the same instant
        *out = reserve(keeper, "vendor.com/gpu", device, claim);
      };
      std::thread a(go, true, &by_claim);
      std::thread b(go, false, &by_pod);
      a.join();
      b.join();
      ASSERT_NE(by_claim.ok(), by_pod.ok()) << device << ": " << by_claim << " / " << by_pod;
      const absl::Status& refused = by_claim.ok() ? by_pod : by_claim;
      EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(refused.message()),
                  ::testing::HasSubstr(absl::StrCat("device ", device, " of vendor.com/gpu is "
                                                    "held by ")));
      claim_won[device] = by_claim.ok();
      if (by_claim.ok()) {
        EXPECT_THAT(std::string(refused.message()),
                    ::testing::HasSubstr("DRA claim default/train (UID claim-a)"));
      } else {
        EXPECT_THAT(std::string(refused.message()),
                    ::testing::HasSubstr("a pod of the extended resource"));
      }
    }
    EXPECT_EQ(claim_won.size(), 100u);
    // However the races went, one device each way.
    ASSERT_TRUE(reserve(keeper, "vendor.com/gpu", "gpu-claimed", true).ok());
    claim_won["gpu-claimed"] = true;
    ASSERT_TRUE(reserve(keeper, "vendor.com/gpu", "gpu-pods", false).ok());
    claim_won["gpu-pods"] = false;
  }
  {
    testing::ShortTempDir one_way_dir;
    StateKeeper one_way(one_way_dir.Sub("state.pb"), &events);
    MustLoad(one_way);
    EXPECT_TRUE(reserve(one_way, "vendor.com/gpu", "gpu-0", true).ok());
    EXPECT_TRUE(reserve(one_way, "vendor.com/gpu", "gpu-0", false).ok());
    EXPECT_TRUE(reserve(one_way, "vendor.com/gpu", "gpu-0", true).ok());
  }
  StateKeeper again(dir.Sub("state.pb"), &events);
  MustLoad(again);
  again.SetOneHolderAcrossPaths(true);
  // Whoever won holds it still: the other path is refused.
  for (const auto& [device, by_claim] : claim_won) {
    const absl::Status other = again.CheckOtherPath("vendor.com/gpu", one(device), !by_claim);
    EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition) << device;
  }
  // The claim's allocations released: their devices go to pods.
  std::vector<uint64_t> ids;
  for (const state::Allocation& a : again.ClaimAllocations("claim-a")) ids.push_back(a.id());
  ASSERT_FALSE(ids.empty());
  ASSERT_TRUE(again.Release(ids).ok());
  EXPECT_TRUE(again.CheckOtherPath("vendor.com/gpu", one("gpu-claimed"), false).ok());
  EXPECT_TRUE(reserve(again, "vendor.com/gpu", "gpu-claimed", false).ok());
}

// A loaded keeper in a fresh state directory, for the tests of how it
// writes: group commit and compaction.
class KeeperWritesTest : public ::testing::Test {
 protected:
  void SetUp() override { MustLoad(keeper); }
  testing::ShortTempDir dir;
  EventLog events{"test"};
  StateKeeper keeper{dir.Sub("state.pb"), &events};
};

// Group commit: Records that arrive while a journal write is in flight are
// written together, with one write and one fdatasync, once it completes.
TEST_F(KeeperWritesTest, RecordsWaitingForTheDiskShareOneJournalWrite) {
  constexpr int kWaiting = 7;
  absl::Notification all_queued;
  std::atomic<int> writes_seen{0};
  absl::Notification writing;
  keeper.SetTestHook([&](const char* where) {
    if (std::string(where) != "journal_write" || writes_seen++ > 0) return;
    writing.Notify();
    // The first write is "on the disk" until every other Record queued.
    EXPECT_TRUE(keeper.WaitForQueued(1 + kWaiting, absl::Seconds(10)));
    all_queued.Notify();
  });
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(1 + kWaiting);
  threads.emplace_back([&] { results[0] = RecordTwo(keeper, "d0", "e0"); });
  ASSERT_TRUE(writing.WaitForNotificationWithTimeout(absl::Seconds(10)));
  for (int i = 1; i <= kWaiting; ++i) {
    threads.emplace_back([&, i] {
      const std::string a = absl::StrCat("d", i), b = absl::StrCat("e", i);
      results[i] = RecordTwo(keeper, a.c_str(), b.c_str());
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(all_queued.HasBeenNotified());
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  // The first write, then one for the seven that waited behind it.
  EXPECT_EQ(keeper.journal_writes(), 2);
  EXPECT_EQ(keeper.journal_records(), 2 * (1 + kWaiting));
  std::set<uint64_t> ids;
  const state::State snapshot = keeper.Snapshot();
  for (const state::Allocation& a : snapshot.allocations()) ids.insert(a.id());
  EXPECT_EQ(ids.size(), 2u * (1 + kWaiting));  // distinct ids
  StateKeeper reloaded(dir.Sub("state.pb"), &events);
  EXPECT_EQ(MustLoad(reloaded).allocations_size(), 2 * (1 + kWaiting));
}

// A record that finds the journal busy is queued and its caller goes on at
// once (no thread waits its turn): the writer at work writes it with its
// next batch and reports to it from there.
TEST_F(KeeperWritesTest, ARecordThatFindsTheJournalBusyIsWrittenByTheWriterAtWork) {
  absl::Notification release;
  std::atomic<int> writes_seen{0};
  absl::Notification writing;
  keeper.SetTestHook([&](const char* where) {
    if (std::string(where) != "journal_write" || writes_seen++ > 0) return;
    writing.Notify();
    EXPECT_TRUE(release.WaitForNotificationWithTimeout(absl::Seconds(30)));
  });
  std::thread::id writer;
  absl::Status first;
  std::thread t1([&] {
    writer = std::this_thread::get_id();
    first = RecordTwo(keeper, "a", "b");
  });
  // t1 writes its record, held on the disk.
  ASSERT_TRUE(writing.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::Notification returned, recorded;
  absl::Status second;
  std::thread::id reported_on;
  std::thread t2([&] {
    keeper.RecordAsync("vendor.com/gpu", TwoContainers("c", "d"), TwoResponses(),
                       BackendSide{"v1beta1", "/s", "", nullptr},
                       [&](absl::Status s) {
                         second = std::move(s);
                         reported_on = std::this_thread::get_id();
                         recorded.Notify();
                       });
    returned.Notify();
  });
  ASSERT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "RecordAsync waited for the journal";
  EXPECT_FALSE(recorded.HasBeenNotified()) << "reported before its record was written";
  EXPECT_TRUE(keeper.WaitForQueued(2, absl::Seconds(10)));
  release.Notify();
  t1.join();
  t2.join();
  ASSERT_TRUE(recorded.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_TRUE(second.ok()) << second;
  EXPECT_EQ(reported_on, writer);
  EXPECT_EQ(keeper.journal_writes(), 2);
  StateKeeper reloaded(dir.Sub("state.pb"), &events);
  EXPECT_EQ(MustLoad(reloaded).allocations_size(), 4);
}

// A failed batch fails every Record in it, and records nothing of any.
TEST_F(KeeperWritesTest, AFailedGroupWriteRefusesEveryRecordInIt) {
  {
    FileSizeLimit small(4096);  // no room for space ahead
    ASSERT_TRUE(RecordTwo(keeper, "a", "b").ok());
  }
  const std::string before = *ReadFile(dir.Sub("journal.wal"));
  std::atomic<int> writes_seen{0};
  absl::Notification writing;
  keeper.SetTestHook([&](const char* where) {
    if (std::string(where) != "journal_write" || writes_seen++ > 0) return;
    writing.Notify();
    EXPECT_TRUE(keeper.WaitForQueued(3, absl::Seconds(10)));
  });
  absl::Status first, second, third;
  {
    // Room for one more record pair, not for the batch of two after it.
    FileSizeLimit full(before.size() + before.size() - 8 + 10);
    std::thread t1([&] { first = RecordTwo(keeper, "c", "d"); });
    // t1's record alone is on its way to the disk.
    ASSERT_TRUE(writing.WaitForNotificationWithTimeout(absl::Seconds(10)));
    std::thread t2([&] { second = RecordTwo(keeper, "e", "f"); });
    std::thread t3([&] { third = RecordTwo(keeper, "g", "h"); });
    t1.join();
    t2.join();
    t3.join();
  }
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_FALSE(second.ok());
  EXPECT_FALSE(third.ok());
  EXPECT_EQ(keeper.Snapshot().allocations_size(), 4);
  StateKeeper reloaded(dir.Sub("state.pb"), &events);
  EXPECT_EQ(MustLoad(reloaded).allocations_size(), 4);
}

// Compaction writes the snapshot on its own thread: Records go on while it
// is stuck on the disk, and the records that arrived meanwhile stay in the
// journal (the snapshot does not hold them).
TEST_F(KeeperWritesTest, RecordsGoOnWhileCompactionWritesTheSnapshot) {
  absl::Notification compaction_started, records_done;
  keeper.SetTestHook([&](const char* where) {
    if (std::string(where) != "snapshot_write" || compaction_started.HasBeenNotified()) return;
    compaction_started.Notify();
    EXPECT_TRUE(records_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  });
  const int pairs = static_cast<int>(StateKeeper::kCompactAfter) / 2;
  for (int i = 0; i < pairs; ++i) {
    const std::string a = absl::StrCat("a", i), b = absl::StrCat("b", i);
    ASSERT_TRUE(RecordTwo(keeper, a.c_str(), b.c_str()).ok());
  }
  ASSERT_TRUE(compaction_started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // The snapshot write is stuck; Records are not.
  for (int i = 0; i < 5; ++i) {
    const std::string a = absl::StrCat("late-a", i), b = absl::StrCat("late-b", i);
    ASSERT_TRUE(RecordTwo(keeper, a.c_str(), b.c_str()).ok());
  }
  records_done.Notify();
  keeper.WaitForCompaction();
  EXPECT_EQ(keeper.compactions(), 1);
  absl::StatusOr<state::State> snapshot = FileStateStore(dir.Sub("state.pb")).Load();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->allocations_size(), 2 * pairs);
  absl::StatusOr<JournalContents> journal = ParseJournal(*ReadFile(dir.Sub("journal.wal")));
  ASSERT_TRUE(journal.ok());
  ASSERT_EQ(journal->records.size(), 10u);
  EXPECT_EQ(journal->records[0].device_ids(0), "late-a0");
  StateKeeper reloaded(dir.Sub("state.pb"), &events);
  EXPECT_EQ(MustLoad(reloaded).allocations_size(), 2 * pairs + 10);
}

}  // namespace

// What a power loss leaves: the journal as it was when an fdatasync last
// returned. A reservation is in it before its caller hears it is durable,
// so every allocation the kubelet was answered for survives; only the
// response of one answered within one sync of the loss may not. A dpproxy
// crash (the page cache survives) keeps the response too.
// Answers left unsynced are synced by the writer at work once they are
// due (kAnswerSyncDelay), with its next batch, even a batch of answers
// alone: the syncer does not take the journal from a busy writer, whose
// queued calls would then be answered from the syncer's thread.
TEST_F(KeeperWritesTest, AWriterKeptBusyByAnswersSyncsThemWhenDue) {
  auto reserve = [&](const char* a, const char* b) {
    absl::Notification durable;
    const AllocationJournal::Reservation r = keeper.ReserveAsync(
        "vendor.com/gpu", TwoContainers(a, b), BackendSide{"v1beta1", "/s", "vendor.com/gpu", nullptr},
        [&](absl::Status st) {
          EXPECT_TRUE(st.ok()) << st;
          durable.Notify();
        });
    EXPECT_TRUE(durable.WaitForNotificationWithTimeout(absl::Seconds(10)));
    return r;
  };
  const AllocationJournal::Reservation first = reserve("a", "b"), second = reserve("c", "d");
  // Which threads synced the journal from here on. Shared with the hook,
  // which the keeper (it outlives this body) may still call after it.
  struct Syncs {
    absl::Mutex mu;
    std::vector<std::thread::id> by;
  };
  auto syncs = std::make_shared<Syncs>();
  keeper.SetTestHook([syncs](const char* where) {
    if (std::string(where) != "journal_synced") return;
    absl::MutexLock lock(&syncs->mu);
    syncs->by.push_back(std::this_thread::get_id());
  });
  absl::Notification second_done;
  std::thread::id second_on;
  std::thread::id writer;
  std::thread t([&] {
    writer = std::this_thread::get_id();
    // The journal is free: this thread writes the first answer, and is the
    // writer while its callback runs. The second answer finds the journal
    // busy and is queued; the first one's caller then keeps the writer
    // past the first answer's due time, as a slow reply to the kubelet.
    keeper.AnswerAsync(first, TwoResponses(), [&](absl::Status st) {
      EXPECT_TRUE(st.ok()) << st;
      keeper.AnswerAsync(second, TwoResponses(), [&](absl::Status st2) {
        EXPECT_TRUE(st2.ok()) << st2;
        second_on = std::this_thread::get_id();
        second_done.Notify();
      });
      absl::SleepFor(StateKeeper::kAnswerSyncDelay + absl::Milliseconds(3));
    });
  });
  t.join();
  ASSERT_TRUE(second_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(second_on, writer) << "the queued answer was written by another thread";
  absl::MutexLock lock(&syncs->mu);
  ASSERT_FALSE(syncs->by.empty()) << "the due answers were not synced with the writer's next batch";
  EXPECT_EQ(syncs->by.front(), writer) << "the answers were synced by another thread";
  EXPECT_EQ(syncs->by.size(), 1u);
}

// An Allocate refused because its answer could not be written (a full
// disk) is withdrawn; that withdrawal cannot be written either at first.
// Once the disk takes writes again, the next write carries it, so its
// reservation is not left in the journal (nor loaded as held at the next
// start).
TEST_F(KeeperWritesTest, AWithdrawalAFullDiskRefusedIsWrittenOnceItTakesWritesAgain) {
  auto load = [&] {
    absl::StatusOr<state::State> st = ReadStateDir(dir.path());
    EXPECT_TRUE(st.ok()) << st.status();
    std::set<std::string> held;
    if (st.ok()) {
      for (const auto& a : st->allocations()) held.insert(a.device_ids(0));
    }
    return held;
  };
  absl::Notification durable;
  const AllocationJournal::Reservation r = keeper.ReserveAsync(
      "vendor.com/gpu", TwoContainers("a", "b"),
      BackendSide{"v1beta1", "/s", "vendor.com/gpu", nullptr}, [&](absl::Status s) {
        EXPECT_TRUE(s.ok()) << s;
        durable.Notify();
      });
  ASSERT_TRUE(durable.WaitForNotificationWithTimeout(absl::Seconds(10)));
  std::atomic<bool> full{true};
  keeper.SetWriteFaultForTest([&full] {
    return full.load() ? absl::ResourceExhaustedError("No space left on device")
                       : absl::OkStatus();
  });
  absl::Notification answered;
  keeper.AnswerAsync(r, TwoResponses(), [&](absl::Status s) {
    EXPECT_FALSE(s.ok());
    answered.Notify();
  });
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  keeper.Withdraw(r);  // as the allocator does with a refused answer
  EXPECT_FALSE(keeper.HoldsDevice("vendor.com/gpu", "a"));
  EXPECT_EQ(load(), (std::set<std::string>{"a", "b"}));  // the reservation, still on disk

  full = false;
  ASSERT_TRUE(RecordTwo(keeper, "c", "d").ok());
  EXPECT_EQ(load(), (std::set<std::string>{"c", "d"}));
}

TEST_F(KeeperWritesTest, APowerLossKeepsEveryAnsweredAllocation) {
  // The journal as of the last fdatasync. Shared with the hook, which the
  // keeper (it outlives this body) may still call after it.
  struct Disk {
    absl::Mutex mu;
    std::string bytes;
    int syncs = 0;
  };
  auto disk = std::make_shared<Disk>();
  keeper.SetTestHook([disk, path = dir.Sub("journal.wal")](const char* where) {
    if (std::string(where) != "journal_synced") return;
    absl::StatusOr<std::string> bytes = ReadFile(path);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    absl::MutexLock lock(&disk->mu);
    disk->bytes = *bytes;
    ++disk->syncs;
  });
  auto image = [&] {
    absl::MutexLock lock(&disk->mu);
    return disk->bytes;
  };
  // What a restart on `journal` (and no snapshot) would load.
  auto load = [&](const std::string& journal) {
    testing::ShortTempDir other;
    EXPECT_TRUE(WriteFileAtomic(other.Sub("journal.wal"), journal, 0600).ok());
    absl::StatusOr<state::State> st = ReadStateDir(other.path());
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? *st : state::State();
  };

  absl::Notification durable;
  std::string at_durable;
  const AllocationJournal::Reservation r =
      keeper.ReserveAsync("vendor.com/gpu", TwoContainers("a", "b"), BackendSide{"v1beta1", "/s", "vendor.com/gpu", nullptr},
                          [&](absl::Status s) {
                            EXPECT_TRUE(s.ok()) << s;
                            at_durable = image();
                            durable.Notify();
                          });
  ASSERT_TRUE(durable.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_EQ(r.count, 2);
  state::State lost = load(at_durable);
  ASSERT_EQ(lost.allocations_size(), 2) << "the reservation was not on the disk when it was "
                                           "reported durable";
  EXPECT_EQ(lost.allocations(1).device_ids(0), "b");
  EXPECT_TRUE(keeper.HoldsDevice("vendor.com/gpu", "b"));

  v1beta1::AllocateResponse resp;
  (*resp.add_container_responses()->mutable_envs())["GPU"] = "a";
  (*resp.add_container_responses()->mutable_envs())["GPU"] = "b";
  absl::Notification answered;
  std::string at_answer;
  keeper.AnswerAsync(r, resp, [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    at_answer = image();
    answered.Notify();
  });
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // A power loss right at the answer: the allocations hold their devices,
  // without responses.
  lost = load(at_answer);
  ASSERT_EQ(lost.allocations_size(), 2);
  EXPECT_EQ(lost.allocations(0).stage(), state::Allocation::RESERVED);
  EXPECT_TRUE(lost.allocations(0).response().empty());
  EXPECT_EQ(lost.allocations(0).device_ids(0), "a");
  // A crash of dpproxy instead: the written answer is in the file.
  absl::StatusOr<std::string> now = ReadFile(dir.Sub("journal.wal"));
  ASSERT_TRUE(now.ok());
  state::State crashed = load(*now);
  ASSERT_EQ(crashed.allocations_size(), 2);
  EXPECT_EQ(crashed.allocations(1).stage(), state::Allocation::WHOLE);
  EXPECT_EQ(ResponseOf(crashed.allocations(1)).envs().at("GPU"), "b");
  // And the answer's own sync follows: then a power loss keeps it too.
  {
    absl::MutexLock lock(&disk->mu);
    ASSERT_TRUE(disk->mu.AwaitWithTimeout(
        absl::Condition(+[](int* n) { return *n >= 2; }, &disk->syncs), absl::Seconds(10)))
        << "the answer was never synced";
  }
  EXPECT_EQ(load(image()).allocations(1).stage(), state::Allocation::WHOLE);
  // In memory, the answered reservations are whole allocations.
  const state::State held = keeper.Snapshot();
  ASSERT_EQ(held.allocations_size(), 2);
  EXPECT_EQ(held.allocations(0).stage(), state::Allocation::WHOLE);
  EXPECT_EQ(held.allocations(1).stage(), state::Allocation::WHOLE);
  EXPECT_EQ(ResponseOf(held.allocations(0)).envs().at("GPU"), "a");
  EXPECT_EQ(ResponseOf(held.allocations(1)).envs().at("GPU"), "b");

  // A withdrawn reservation frees its devices at once, and for a restart.
  absl::Notification durable2;
  const AllocationJournal::Reservation w =
      keeper.ReserveAsync("vendor.com/gpu", TwoContainers("c", "d"), BackendSide{"v1beta1", "/s", "vendor.com/gpu", nullptr},
                          [&](absl::Status s) {
                            EXPECT_TRUE(s.ok()) << s;
                            durable2.Notify();
                          });
  ASSERT_TRUE(durable2.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(keeper.HoldsDevice("vendor.com/gpu", "c"));
  keeper.Withdraw(w);
  EXPECT_FALSE(keeper.HoldsDevice("vendor.com/gpu", "c"));
  EXPECT_EQ(keeper.Snapshot().allocations_size(), 2);
  absl::StatusOr<state::State> read = ReadStateDir(dir.path());
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read->allocations_size(), 2);
  EXPECT_EQ(read->allocations(1).device_ids(0), "b");
}

}  // namespace dpproxy
