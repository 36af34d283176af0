// The watchdog on its own (backend_watchdog.h): a backend that misses the
// configured number of asks in a row is silent, the first answer ends the
// silence, a withdrawn ask is no miss, another backend starts afresh, and
// an interval of zero turns it off. The test answers each ask itself.
#include "proxy/core/backend_watchdog.h"

#include <deque>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/mock_backend.h"

namespace dpproxy {
namespace {

// Keeps each ask for the test to answer.
class AskedBackend : public testing::MockBackend {
 public:
  void ProbeAsync(absl::Duration timeout, std::function<void(absl::Status)> done) override {
    asks.push_back(std::move(done));
    last_timeout = timeout;
  }
  // Answers the oldest ask with `s`.
  void Answer(absl::Status s) {
    ASSERT_FALSE(asks.empty());
    auto done = std::move(asks.front());
    asks.pop_front();
    done(s);
  }
  std::deque<std::function<void(absl::Status)>> asks;
  absl::Duration last_timeout;
};

class BackendWatchdogTest : public ::testing::Test {
 protected:
  BackendWatchdogTest() {
    watchdog_.SetSettings({absl::Seconds(10), absl::Seconds(4), 3});
  }
  // One pass `s` seconds after the start, with the backend of `generation`.
  void TickAt(int s, uint64_t generation = 1) {
    watchdog_.Tick(start_ + absl::Seconds(s), backend_, generation);
  }
  absl::Status Missed() { return absl::DeadlineExceededError("no answer"); }

  const absl::Time start_ = absl::Now();
  std::shared_ptr<AskedBackend> backend_ = std::make_shared<AskedBackend>();
  std::vector<std::string> heard_;
  BackendWatchdog watchdog_{{[this](uint64_t g, absl::Duration) {
                               heard_.push_back("silent " + std::to_string(g));
                             },
                             [this](uint64_t g, absl::Duration) {
                               heard_.push_back("answering " + std::to_string(g));
                             }}};
};

TEST_F(BackendWatchdogTest, ABackendMissingAskInARowIsSilentUntilItAnswers) {
  TickAt(0);  // attached: the first ask one interval later
  EXPECT_TRUE(backend_->asks.empty());
  TickAt(5);
  EXPECT_TRUE(backend_->asks.empty());
  TickAt(10);
  ASSERT_EQ(backend_->asks.size(), 1u);
  EXPECT_EQ(backend_->last_timeout, absl::Seconds(4));
  TickAt(15);  // one ask at a time
  EXPECT_EQ(backend_->asks.size(), 1u);
  backend_->Answer(Missed());
  TickAt(20);
  backend_->Answer(Missed());
  EXPECT_FALSE(watchdog_.silent(1));
  EXPECT_TRUE(heard_.empty());
  TickAt(30);
  backend_->Answer(Missed());
  EXPECT_TRUE(watchdog_.silent(1));
  EXPECT_THAT(heard_, ::testing::ElementsAre("silent 1"));
  // Told once per silence.
  TickAt(40);
  backend_->Answer(Missed());
  EXPECT_EQ(heard_.size(), 1u);
  // Any answer ends it (an error the plugin sent back is an answer).
  TickAt(50);
  backend_->Answer(absl::OkStatus());
  EXPECT_FALSE(watchdog_.silent(1));
  EXPECT_THAT(heard_, ::testing::ElementsAre("silent 1", "answering 1"));
}

TEST_F(BackendWatchdogTest, AnAnswerBetweenMissesStartsTheCountAgain) {
  TickAt(0);
  for (int s : {10, 20}) {
    TickAt(s);
    backend_->Answer(Missed());
  }
  TickAt(30);
  backend_->Answer(absl::OkStatus());
  for (int s : {40, 50}) {
    TickAt(s);
    backend_->Answer(Missed());
  }
  EXPECT_FALSE(watchdog_.silent(1));
  EXPECT_TRUE(heard_.empty());
}

TEST_F(BackendWatchdogTest, AWithdrawnAskIsNoMiss) {
  TickAt(0);
  for (int s : {10, 20, 30, 40}) {
    TickAt(s);
    backend_->Answer(absl::CancelledError("backend stopped"));
  }
  EXPECT_FALSE(watchdog_.silent(1));
  EXPECT_TRUE(heard_.empty());
}

TEST_F(BackendWatchdogTest, AnotherBackendStartsAfreshAndAnOldAnswerCountsForNothing) {
  TickAt(0);
  for (int s : {10, 20}) {
    TickAt(s);
    backend_->Answer(Missed());
  }
  TickAt(30);  // in flight when the backend is replaced
  TickAt(31, 2);
  backend_->Answer(Missed());
  EXPECT_TRUE(heard_.empty());
  TickAt(41, 2);
  backend_->Answer(Missed());
  EXPECT_FALSE(watchdog_.silent(2));
  EXPECT_TRUE(heard_.empty());
}

TEST_F(BackendWatchdogTest, AnIntervalOfZeroTurnsItOff) {
  watchdog_.SetSettings({absl::ZeroDuration(), absl::Seconds(4), 3});
  for (int s = 0; s < 100; s += 10) TickAt(s);
  EXPECT_TRUE(backend_->asks.empty());
}

}  // namespace
}  // namespace dpproxy
