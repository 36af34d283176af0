// JournalWriter on its own (journal_writer.h): a real journal file in a
// temporary directory, an owner that notes each batch, and the test hook
// holding a write "on the disk" while the test queues behind it.
#include "proxy/state/journal_writer.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

// What the owner saw of one batch.
struct Seen {
  std::vector<uint64_t> ids;
  bool written_only = false;
  absl::Status status;
  size_t journal_records = 0;
};

class Owner : public JournalWriter::Owner {
 public:
  void BatchWrittenLocked(const JournalWriter::Batch& batch,
                          const JournalWriter::Written& w) override {
    Seen s;
    s.written_only = batch.front()->written_only;
    s.status = w.status;
    s.journal_records = w.journal_records;
    for (const auto& e : batch) {
      for (const state::Allocation& a : e->records) s.ids.push_back(a.id());
    }
    batches.push_back(std::move(s));
  }
  void SyncFailedLocked(const absl::Status& s) override { sync_failures.push_back(s); }

  std::vector<Seen> batches;  // guarded by the writer's mutex
  std::vector<absl::Status> sync_failures;
};

class JournalWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(writer.file()->Open().ok());
    absl::MutexLock lock(&mu);
    writer.SetOpenLocked(true);
  }

  // An entry of one record `id` at `stage`; written_only for answers and
  // withdrawals. Its `done` counts into outcomes.
  std::unique_ptr<JournalWriter::Entry> Entry(uint64_t id, state::Allocation::Stage stage) {
    auto e = std::make_unique<JournalWriter::Entry>();
    state::Allocation a;
    a.set_id(id);
    a.set_resource("vendor.com/gpu");
    a.add_device_ids(absl::StrCat("gpu-", id));
    a.set_stage(stage);
    e->records.push_back(std::move(a));
    e->written_only = stage != state::Allocation::RESERVED;
    e->done = [this](absl::Status s) {
      absl::MutexLock lock(&outcomes_mu);
      outcomes.push_back(std::move(s));
    };
    return e;
  }

  // Queues an entry as a caller does: writes the queue if it finds the
  // journal free.
  void Submit(std::unique_ptr<JournalWriter::Entry> e) {
    bool write;
    {
      absl::MutexLock lock(&mu);
      write = writer.EnqueueLocked(std::move(e));
    }
    if (write) writer.WriteQueued();
  }

  // Holds the first write until `release` is notified; `writing` tells
  // when it is held.
  void HoldFirstWrite() {
    writer.SetTestHook([this](const char* where) {
      if (std::string(where) != "journal_write" || writes_seen++ > 0) return;
      writing.Notify();
      EXPECT_TRUE(release.WaitForNotificationWithTimeout(absl::Seconds(10)));
    });
  }

  std::vector<Seen> Batches() {
    absl::MutexLock lock(&mu);
    return owner.batches;
  }

  testing::ShortTempDir dir;
  absl::Mutex mu;
  Owner owner;
  JournalWriter writer{dir.Sub("journal.wal"), &mu, &owner};
  std::atomic<int> writes_seen{0};
  absl::Notification writing, release;
  absl::Mutex outcomes_mu;
  std::vector<absl::Status> outcomes;
};

// Answers and withdrawals queued behind reservations are written first, in
// a batch of their own (nobody waits for their sync); the reservations
// follow in one batch, synced.
TEST_F(JournalWriterTest, AnswersQueuedBehindReservationsGoFirstInABatchOfTheirOwn) {
  HoldFirstWrite();
  std::thread first([&] { Submit(Entry(1, state::Allocation::RESERVED)); });
  ASSERT_TRUE(writing.WaitForNotificationWithTimeout(absl::Seconds(10)));
  Submit(Entry(2, state::Allocation::RESERVED));
  Submit(Entry(3, state::Allocation::RESERVED));
  Submit(Entry(1, state::Allocation::ANSWERED));
  Submit(Entry(9, state::Allocation::WITHDRAWN));
  ASSERT_TRUE(writer.WaitForQueued(5, absl::Seconds(10)));
  release.Notify();
  first.join();

  const std::vector<Seen> b = Batches();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].ids, std::vector<uint64_t>({1}));
  EXPECT_FALSE(b[0].written_only);
  EXPECT_EQ(b[1].ids, std::vector<uint64_t>({1, 9}));
  EXPECT_TRUE(b[1].written_only);
  EXPECT_EQ(b[2].ids, std::vector<uint64_t>({2, 3}));
  EXPECT_FALSE(b[2].written_only);
  EXPECT_EQ(b[2].journal_records, 5u);
  EXPECT_EQ(writer.writes(), 3);
  EXPECT_EQ(writer.records(), 5);
  absl::MutexLock lock(&outcomes_mu);
  ASSERT_EQ(outcomes.size(), 5u);
  for (const absl::Status& s : outcomes) EXPECT_TRUE(s.ok()) << s;
}

// A saver that asks for the journal while a writer has entries queued gets
// it between two batches; what queued meanwhile is written when the saver
// lets go, by the saver's thread.
TEST_F(JournalWriterTest, ASaverGetsTheJournalBetweenTwoBatches) {
  HoldFirstWrite();
  std::thread first([&] { Submit(Entry(1, state::Allocation::RESERVED)); });
  ASSERT_TRUE(writing.WaitForNotificationWithTimeout(absl::Seconds(10)));
  Submit(Entry(2, state::Allocation::RESERVED));
  // The saver takes the lock, says so, and waits in AcquireLocked, which
  // lets go of the lock: the writer, done with its write, can take the lock
  // back only once the saver waits.
  absl::Notification asking;
  size_t batches_when_acquired = 0;
  std::thread saver([&] {
    absl::MutexLock lock(&mu);
    asking.Notify();
    writer.AcquireLocked();
    batches_when_acquired = owner.batches.size();
    writer.ReleaseLocked();
  });
  ASSERT_TRUE(asking.WaitForNotificationWithTimeout(absl::Seconds(10)));
  release.Notify();
  first.join();
  saver.join();
  EXPECT_EQ(batches_when_acquired, 1u);
  const std::vector<Seen> b = Batches();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[1].ids, std::vector<uint64_t>({2}));
  EXPECT_TRUE(b[1].status.ok());
}

// A failed write refuses every entry in it; a withdrawal in it is written
// again ahead of the next batch, so that the reservation it ends does not
// outlive it in the journal.
TEST_F(JournalWriterTest, AWithdrawalAFailedWriteLostIsWrittenWithTheNextBatch) {
  std::atomic<bool> full{true};
  writer.SetWriteFaultForTest([&] {
    return full ? absl::ResourceExhaustedError("no space left on device") : absl::OkStatus();
  });
  Submit(Entry(4, state::Allocation::WITHDRAWN));
  full = false;
  Submit(Entry(5, state::Allocation::RESERVED));

  const std::vector<Seen> b = Batches();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(b[1].status.ok());
  EXPECT_EQ(b[1].journal_records, 2u);  // the withdrawal, then the reservation
  {
    absl::MutexLock lock(&outcomes_mu);
    ASSERT_EQ(outcomes.size(), 2u);
    EXPECT_FALSE(outcomes[0].ok());
    EXPECT_TRUE(outcomes[1].ok());
  }
  JournalFile reread(dir.Sub("journal.wal"));
  absl::StatusOr<JournalFile::Replay> replay = reread.Open();
  ASSERT_TRUE(replay.ok()) << replay.status();
  ASSERT_EQ(replay->records.size(), 2u);
  EXPECT_EQ(replay->records[0].id(), 4u);
  EXPECT_EQ(replay->records[0].stage(), state::Allocation::WITHDRAWN);
  EXPECT_EQ(replay->records[1].id(), 5u);
}

// Closing waits for the writer at work and every entry queued behind it;
// once closed the journal is no longer open, and what was written stays.
TEST_F(JournalWriterTest, CloseWaitsForTheQueueAndThenClosesTheFile) {
  HoldFirstWrite();
  std::thread first([&] { Submit(Entry(1, state::Allocation::RESERVED)); });
  ASSERT_TRUE(writing.WaitForNotificationWithTimeout(absl::Seconds(10)));
  Submit(Entry(2, state::Allocation::RESERVED));
  absl::Notification closing;
  size_t batches_when_closed = 0;
  std::thread closer([&] {
    absl::MutexLock lock(&mu);
    closing.Notify();
    writer.CloseLocked();
    EXPECT_FALSE(writer.open());
    batches_when_closed = owner.batches.size();
  });
  ASSERT_TRUE(closing.WaitForNotificationWithTimeout(absl::Seconds(10)));
  release.Notify();
  first.join();
  closer.join();
  EXPECT_EQ(batches_when_closed, 2u);
  EXPECT_FALSE(writer.file()->is_open());
  JournalFile reread(dir.Sub("journal.wal"));
  absl::StatusOr<JournalFile::Replay> replay = reread.Open();
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->records.size(), 2u);
}

}  // namespace
}  // namespace dpproxy
