// StateLoader on its own: what a start reads back from real files in a
// scratch directory (a fresh start, a snapshot and the journal's records
// since it, a journal that is no journal, a snapshot proven damaged), and
// what it reports.
#include "proxy/state/state_loader.h"

#include <dirent.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proxy/events/event_log.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/previous_generation.h"
#include "proxy/state/state_store.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

state::Allocation Record(uint64_t id, const std::string& device) {
  state::Allocation a;
  a.set_id(id);
  a.set_resource("vendor.com/gpu");
  a.add_device_ids(device);
  return a;
}

std::vector<uint64_t> Ids(const AllocationTable& t) {
  std::vector<uint64_t> out;
  t.ForEach([&](const state::Allocation& a) { out.push_back(a.id()); });
  return out;
}

bool Emitted(const EventLog& events, const std::string& name) {
  for (const Json& e : events.Snapshot()) {
    if (e.value("event", "") == name) return true;
  }
  return false;
}

class StateLoaderTest : public ::testing::Test {
 protected:
  absl::StatusOr<StateLoader::Loaded> Load() {
    FileStateStore store(snapshot_);
    JournalFile journal(journal_path_);
    PreviousGeneration previous(snapshot_);
    return StateLoader(&store, &journal, &previous, &events_).Load();
  }
  // A snapshot holding `ids`; its next_allocation_id is the last id given
  // (the keeper hands out the one after it).
  void SaveSnapshot(const std::vector<uint64_t>& ids) {
    state::State st;
    for (uint64_t id : ids) *st.add_allocations() = Record(id, "gpu-" + std::to_string(id));
    st.set_next_allocation_id(ids.empty() ? 0 : ids.back());
    st.add_resources()->set_name("vendor.com/gpu");
    ASSERT_TRUE(FileStateStore(snapshot_).Save(st).ok());
  }
  void AppendToJournal(const std::vector<state::Allocation>& records) {
    JournalFile journal(journal_path_);
    ASSERT_TRUE(journal.Open().ok());
    ASSERT_TRUE(journal.Append(records).ok());
    journal.Close();
  }

  testing::ShortTempDir dir_;
  std::string snapshot_ = dir_.path() + "/state.pb";
  std::string journal_path_ = dir_.path() + "/journal.wal";
  EventLog events_{"test"};
};

TEST_F(StateLoaderTest, AFreshDirectoryIsAnEmptyStateAndANewJournal) {
  absl::StatusOr<StateLoader::Loaded> loaded = Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->allocations.size(), 0u);
  EXPECT_FALSE(loaded->damaged);
  EXPECT_FALSE(loaded->fell_back);
  EXPECT_EQ(loaded->journal_records, 0u);
  EXPECT_TRUE(PathExists(journal_path_));
}

TEST_F(StateLoaderTest, TheJournalsRecordsJoinTheSnapshots) {
  SaveSnapshot({1, 2});
  AppendToJournal({Record(3, "gpu-3")});
  absl::StatusOr<StateLoader::Loaded> loaded = Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(Ids(loaded->allocations), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(loaded->state.next_allocation_id(), 3u);
  EXPECT_EQ(loaded->state.resources_size(), 1);
  EXPECT_EQ(loaded->journal_records, 1u);
  EXPECT_FALSE(loaded->damaged);
  EXPECT_TRUE(Emitted(events_, "state_loaded"));
}

TEST_F(StateLoaderTest, AJournalThatIsNoJournalIsMovedAsideAndReported) {
  SaveSnapshot({1});
  ASSERT_TRUE(WriteFileAtomic(journal_path_, "not a journal at all").ok());
  absl::StatusOr<StateLoader::Loaded> loaded = Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->damaged);
  EXPECT_EQ(Ids(loaded->allocations), (std::vector<uint64_t>{1}));
  EXPECT_TRUE(Emitted(events_, "state_untrusted"));
  bool aside = false;
  DIR* d = ::opendir(dir_.path().c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = ::readdir(d)) {
    aside = aside || std::string(e->d_name).rfind("journal.wal.corrupt-", 0) == 0;
  }
  ::closedir(d);
  EXPECT_TRUE(aside) << "no journal.wal.corrupt-* beside the new journal";
}

TEST_F(StateLoaderTest, ADamagedSnapshotFallsBackAndKeepsTheJournalsRecords) {
  AppendToJournal({Record(5, "gpu-5")});
  ASSERT_TRUE(WriteFileAtomic(snapshot_, std::string(64, '\xff')).ok());
  absl::StatusOr<StateLoader::Loaded> loaded = Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->damaged);
  EXPECT_TRUE(loaded->fell_back);
  EXPECT_EQ(Ids(loaded->allocations), (std::vector<uint64_t>{5}));
  // No previous snapshot: no resource is known.
  EXPECT_EQ(loaded->state.resources_size(), 0);
  EXPECT_TRUE(Emitted(events_, "state_fell_back"));
}

}  // namespace
}  // namespace dpproxy
