// Disk faults on real filesystems: the state directory on a small tmpfs
// that fills up, remounted read-only, and a snapshot damaged at many
// points. Mounts are made in a private mount namespace of this test process
// (nothing is mounted on the host; they vanish with the process), which
// needs root, as dpproxy itself does.
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/state_dir.h"
#include "proxy/state/state_store.h"
#include "tests/proxy/proxy_harness.h"

namespace dpproxy {
namespace {

using ::dpproxy::ApiVersion;
using sim::Personality;
using testing::kWait;
using testing::ProxyHarness;
using ::testing::HasSubstr;

constexpr char kGpu[] = "vendor.com/gpu";

// A private mount namespace for this process, once.
bool PrivateMounts() {
  static const bool ok = [] {
    if (::unshare(CLONE_NEWNS) != 0) return false;
    return ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
  }();
  return ok;
}

void MountTmpfs(const std::string& dir, const std::string& options) {
  ASSERT_TRUE(PrivateMounts()) << "cannot make a private mount namespace (run as root): "
                               << ErrnoText(errno);
  ASSERT_EQ(::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()), 0) << ErrnoText(errno);
}

// Fills the filesystem of `dir` with a file, until ENOSPC.
void Fill(const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  std::string chunk(4096, 'x');
  while (f.write(chunk.data(), chunk.size()) && f.flush()) {
  }
}

// The harness with its state directory on a 256 KiB tmpfs, a plugin, and
// the kubelet seeing its devices.
// `padding`: bytes the plugin adds to each Allocate answer.
void UpWithStateOnTmpfs(ProxyHarness& h, size_t padding = 0) {
  ASSERT_TRUE(MakeDirs(h.dir("state")).ok());
  MountTmpfs(h.dir("state"), "size=256k,mode=0755");
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.allocate_padding = padding;
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
}

sim::AllocateRequest Pod(const std::string& name) {
  return testing::PodRequest(name, {{"main", 1}}, kGpu);
}

TEST(DiskFaultTest, FullDiskRefusesAllocateCountsItAndRecovers) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  UpWithStateOnTmpfs(h);
  absl::StatusOr<sim::AllocateResponse> first = h.sim().Allocate(Pod("first"));
  ASSERT_TRUE(first.ok()) << first.status();

  Fill(h.dir("state/filler"));
  // Appends fit in the journal's last page until it is full; then the disk
  // is out of space and the next Allocate is refused.
  int acknowledged = 1;
  absl::StatusOr<sim::AllocateResponse> refused;
  for (int i = 0; i < 200; ++i) {
    refused = h.sim().Allocate(Pod(absl::StrCat("p", i)));
    if (!refused.ok()) break;
    ++acknowledged;
    ASSERT_TRUE(h.sim().DeletePod(refused->pod_uid()).ok());
  }
  ASSERT_FALSE(refused.ok()) << "the disk never filled up";
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("cannot persist"));
  EXPECT_GE(h.proxy().state()->save_failures(), 1);
  Json status = StatusToJson(h.proxy().Status());
  EXPECT_FALSE(status["state"]["writable"].get<bool>());
  EXPECT_THAT(status["state"]["last_write_error"].get<std::string>(), HasSubstr("space"));

  ASSERT_EQ(::unlink(h.dir("state/filler").c_str()), 0);
  absl::StatusOr<sim::AllocateResponse> after = h.sim().Allocate(Pod("after"));
  ASSERT_TRUE(after.ok()) << after.status();
  ++acknowledged;
  EXPECT_TRUE(h.proxy().Status().state->writable);
  // Every acknowledged allocation is on disk; the refused one is not.
  h.RestartProxy();  // the old one closed its files
  absl::StatusOr<state::State> st = ReadStateDir(h.dir("state"));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->allocations_size(), acknowledged);
  ASSERT_EQ(::umount2(h.dir("state").c_str(), MNT_DETACH), 0);
}

// A start on a full disk (a crash left journal records to fold into a
// snapshot, and nothing can be written): dpproxy starts on what it loaded,
// serves the kubelet and keeps the held devices held, refuses new
// Allocates naming the full disk, and takes them again once space returns.
TEST(DiskFaultTest, AStartOnAFullDiskServesWhatItLoadedAndRecovers) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  // Answers of 16 KiB: the snapshot that folds the journal in needs more
  // pages than the previous generation it replaces frees.
  UpWithStateOnTmpfs(h, 16 << 10);
  absl::StatusOr<sim::AllocateResponse> kept = h.sim().Allocate(Pod("kept"));
  ASSERT_TRUE(kept.ok()) << kept.status();
  const std::string held = kept->allocations(0).device_ids(0);
  // What a crash leaves: the journal holding the allocation (a clean stop
  // folds it into the snapshot), which the next start folds.
  const std::string image = h.dir("crash-image");
  ASSERT_TRUE(MakeDirs(image).ok());
  for (const char* f : {"state.pb", "journal.wal"}) {
    absl::StatusOr<std::string> bytes = ReadFile(h.dir("state/") + f);
    ASSERT_TRUE(bytes.ok()) << f << ": " << bytes.status();
    ASSERT_TRUE(WriteFileAtomic(JoinPath(image, f), *bytes).ok());
  }
  h.RestartProxy();
  for (const char* f : {"state.pb", "journal.wal"}) {
    ASSERT_TRUE(WriteFileAtomic(h.dir("state/") + f, *ReadFile(JoinPath(image, f))).ok());
  }
  ASSERT_TRUE(ReadStateDir(h.dir("state")).ok());
  // Full to the last byte: no page is left for anything new.
  Fill(h.dir("state/filler"));
  Fill(h.dir("state/filler2"));
  absl::Status started = h.proxy().Start();
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 1);
  Json status = StatusToJson(h.proxy().Status());
  EXPECT_FALSE(status["state"]["writable"].get<bool>());
  EXPECT_THAT(status["state"]["last_write_error"].get<std::string>(), HasSubstr("space"));
  EXPECT_TRUE(h.proxy().events().WaitForEvent("state_save_failed", {}, absl::ZeroDuration()));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));  // the plugin is back
  absl::StatusOr<sim::AllocateResponse> refused = h.sim().Allocate(Pod("refused"));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("cannot persist"));
  // Space again: Allocates are taken, and the held device stays held.
  ASSERT_EQ(::unlink(h.dir("state/filler").c_str()), 0);
  ASSERT_EQ(::unlink(h.dir("state/filler2").c_str()), 0);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<sim::AllocateResponse> after = h.sim().Allocate(Pod(absl::StrCat("after", i)));
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_NE(after->allocations(0).device_ids(0), held);
  }
  EXPECT_TRUE(h.proxy().Status().state->writable);
  h.RestartProxy();
  absl::StatusOr<state::State> st = ReadStateDir(h.dir("state"));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->allocations_size(), 4);
  ASSERT_EQ(::umount2(h.dir("state").c_str(), MNT_DETACH), 0);
}

TEST(DiskFaultTest, ReadOnlyStateDirStopsStartUp) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  UpWithStateOnTmpfs(h);
  ASSERT_TRUE(h.sim().Allocate(Pod("kept")).ok());
  h.RestartProxy();  // the old one closed its files (remounting needs that)
  ASSERT_EQ(::mount(nullptr, h.dir("state").c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr), 0)
      << ErrnoText(errno);
  h.RestartProxy();
  absl::Status s = h.proxy().Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("Read-only file system"));
  // Writable again: everything acknowledged is still there.
  ASSERT_EQ(::mount(nullptr, h.dir("state").c_str(), nullptr, MS_REMOUNT, nullptr), 0);
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 1);
  h.RestartProxy();
  ASSERT_EQ(::umount2(h.dir("state").c_str(), MNT_DETACH), 0);
}

// A snapshot truncated or bit-flipped anywhere is moved aside, never
// trusted, and the journal's records are still loaded.
TEST(DiskFaultTest, DamagedSnapshotAnywhereIsMovedAsideAndTheJournalKept) {
  testing::ShortTempDir dir;
  EventLog events("test");
  state::State snap;
  for (int i = 1; i <= 3; ++i) {
    state::Allocation* a = snap.add_allocations();
    a->set_id(i);
    a->set_resource(kGpu);
    a->add_device_ids(absl::StrCat("gpu-", i));
  }
  snap.set_next_allocation_id(3);
  const std::string good = EncodeStateFile(snap);
  int cases = 0;
  for (size_t at = 0; at < good.size(); at += 7) {
    for (bool truncate : {true, false}) {
      testing::ShortTempDir d;
      std::string bad = good;
      if (truncate) {
        bad.resize(at);
      } else {
        bad[at] ^= 0x10;
      }
      ASSERT_TRUE(WriteFileAtomic(d.Sub("state.pb"), bad).ok());
      StateKeeper keeper(d.Sub("state.pb"), &events);
      ASSERT_TRUE(keeper.Load().ok());
      // Recorded after the damage: in the journal, so never lost.
      v1beta1::AllocateRequest req;
      req.add_container_requests()->add_devices_ids("gpu-9");
      v1beta1::AllocateResponse resp;
      resp.add_container_responses();
      ASSERT_TRUE(keeper.Record(kGpu, req, resp, "v1beta1", "/s").ok());
      StateKeeper again(d.Sub("state.pb"), &events);
      absl::StatusOr<state::State> st = again.Load();
      ASSERT_TRUE(st.ok()) << st.status();
      EXPECT_EQ(st->allocations_size(), 1) << "offset " << at;
      ++cases;
    }
  }
  EXPECT_GT(cases, 20);
}

}  // namespace
}  // namespace dpproxy
