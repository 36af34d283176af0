// A kubelet that restarts without its checkpoint forgets the devices of
// the containers that keep running (as real 1.26 and 1.36 kubelets do): it counts
// them free, and it re-admits its running pods against allocatable. These
// tests play that on the simulated kubelet of several releases, with real
// processes on real sockets, and judge dpproxy by what the pods see: no
// running pod denied or killed, no device used by two running containers
// (the container runtime's view, sim::DeviceState::used_by), no new pod
// failed by a hold whose holder is gone.
#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/proxy/proxy_harness.h"
#include "tests/testing/sim_helpers.h"

namespace dpproxy {
namespace {

using sim::Personality;
using testing::kWait;
using testing::ProxyHarness;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr char kGpu[] = "vendor.com/gpu";

sim::AllocateRequest Pod(const std::string& name,
                         const std::vector<std::pair<std::string, int>>& containers) {
  return testing::PodRequest(name, containers, kGpu);
}

// Devices the container runtime has given to more than one running
// container: "gpu-1: default/a/main, default/c/main".
std::vector<std::string> UsedTwice(const sim::State& st) {
  std::vector<std::string> out;
  for (const auto& r : st.resources()) {
    for (const auto& d : r.devices()) {
      if (d.used_by_size() > 1) {
        out.push_back(absl::StrCat(d.id(), ": ", absl::StrJoin(d.used_by(), ", ")));
      }
    }
  }
  return out;
}

// Pods the kubelet has failed or denied, with why.
std::vector<std::string> FailedPods(const sim::State& st) {
  std::vector<std::string> out;
  for (const auto& p : st.pods()) {
    if (p.phase() != "Running") out.push_back(absl::StrCat(p.name(), ": ", p.message()));
  }
  return out;
}

// Reconciliation passes run by hand, nothing is released for its age, and
// `start_grace` is the window after a kubelet start (the default is 10 s).
std::function<void(ProxyConfig&)> ByHand(absl::Duration start_grace = absl::ZeroDuration()) {
  return [start_grace](ProxyConfig& c) {
    c.reconcile_interval = absl::ZeroDuration();
    c.reconcile_grace = absl::Hours(1);
    c.reconcile_start_grace = start_grace;
  };
}

// The simulated kubelet, dpproxy and a v1beta1 sample plugin of 4 devices
// behind it, up and seen by the kubelet.
void Up(ProxyHarness& h) {
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
}

// The kubelet stops, its checkpoint is deleted, it starts again; the
// running containers go on with their devices.
void LoseCheckpoint(sim::KubeletSim& sim) {
  sim.Stop();
  ASSERT_EQ(::unlink(sim.checkpoint_path().c_str()), 0);
  ASSERT_TRUE(sim.Start().ok());
}

// The same with dpproxy in front: it has marked the running pods' devices
// forgotten, and the kubelet has re-admitted its pods.
void LoseCheckpointAndResync(ProxyHarness& h) {
  const size_t from = h.proxy().events().Size();
  ASSERT_NO_FATAL_FAILURE(LoseCheckpoint(h.sim()));
  ASSERT_TRUE(h.proxy().events().WaitForEvent("devices_forgotten", {{"resource", kGpu}}, kWait,
                                              from));
  ASSERT_TRUE(h.sim().WaitForPodsSynced(kWait));
}

struct Release {
  const char* kubelet;
  // Serves pod-resources v1 (1.20+; the reconciler reads v1 only).
  bool pod_resources;
  // Re-admission allocates again for running containers (before 1.25).
  bool reallocates;
};

class ForgottenTest : public ::testing::TestWithParam<Release> {
 protected:
  std::unique_ptr<ProxyHarness> Harness(std::function<void(ProxyConfig&)> tweak = nullptr) {
    const Release r = GetParam();
    absl::StatusOr<sim::KubeletVersion> v = sim::ParseKubeletVersion(r.kubelet);
    EXPECT_TRUE(v.ok()) << v.status();
    return std::make_unique<ProxyHarness>(
        v->personality, false,
        [tweak](ProxyConfig& c) {
          c.reconcile_interval = absl::ZeroDuration();  // passes run by hand
          c.reconcile_grace = absl::Hours(1);
          c.reconcile_start_grace = absl::Seconds(10);  // the default
          if (tweak) tweak(c);
        },
        [&](sim::KubeletSimOptions& o) {
          o.kubelet = *v;
          o.pod_resources = r.pod_resources;
        });
  }

  // dpproxy learns who holds what, from whatever the release offers.
  void Learn(ProxyHarness& h) {
    if (GetParam().pod_resources) {
      ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
    }
    ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());
  }
};

// Two running pods hold 3 of 4 devices; the kubelet restarts without its
// checkpoint. Every running pod is kept, the free device goes to the next
// pod, a pod beyond that is refused rather than given a running pod's
// device, and once a holder is deleted its devices go to the next pod at
// once.
TEST_P(ForgottenTest, NoRunningPodKilledAndNoDeviceUsedTwice) {
  std::unique_ptr<ProxyHarness> h = Harness();
  ASSERT_NO_FATAL_FAILURE(Up(*h));
  absl::StatusOr<sim::AllocateResponse> a = h->sim().Allocate(Pod("a", {{"main", 2}}));
  absl::StatusOr<sim::AllocateResponse> b = h->sim().Allocate(Pod("b", {{"main", 1}}));
  ASSERT_TRUE(a.ok() && b.ok());
  Learn(*h);

  const size_t from = h->proxy().events().Size(), sim_from = h->sim().events().Size();
  LoseCheckpoint(h->sim());
  ASSERT_TRUE(h->proxy().events().WaitForEvent("devices_forgotten", {{"resource", kGpu}}, kWait,
                                               from));
  ASSERT_TRUE(h->sim().WaitForPodsSynced(kWait));
  sim::State st = h->sim().GetState();
  EXPECT_THAT(FailedPods(st), IsEmpty()) << "running pods were denied at re-admission";
  EXPECT_FALSE(h->sim().events().WaitForEvent("readmission_denied", {}, absl::ZeroDuration(),
                                              sim_from));
  for (const auto& d : testing::FindResource(st, kGpu)->devices()) {
    EXPECT_EQ(d.health(), "Healthy") << d.id();
  }
  EXPECT_THAT(UsedTwice(st), IsEmpty());

  // The free device goes to the next pod.
  absl::StatusOr<sim::AllocateResponse> c = h->sim().Allocate(Pod("c", {{"main", 1}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(UsedTwice(h->sim().GetState()), IsEmpty());
  // None is left: a pod beyond that fails instead of sharing.
  absl::StatusOr<sim::AllocateResponse> d = h->sim().Allocate(Pod("d", {{"main", 1}}));
  EXPECT_FALSE(d.ok());
  if (!GetParam().reallocates) {
    // The kubelet counted the running pods' devices free: dpproxy refused,
    // naming the holder.
    EXPECT_THAT(d.status().message(), HasSubstr("still in use by a running container"));
    EXPECT_THAT(d.status().message(), HasSubstr("pod default/"));
  }
  EXPECT_THAT(UsedTwice(h->sim().GetState()), IsEmpty());
  EXPECT_THAT(FailedPods(h->sim().GetState()), ::testing::ElementsAre(HasSubstr("d: ")));

  // A holder is deleted; the next pod is admitted at once on its devices.
  ASSERT_TRUE(h->sim().DeletePod(a->pod_uid()).ok());
  absl::StatusOr<sim::AllocateResponse> e = h->sim().Allocate(Pod("e", {{"main", 2}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_THAT(UsedTwice(h->sim().GetState()), IsEmpty());
  EXPECT_THAT(FailedPods(h->sim().GetState()), ::testing::ElementsAre(HasSubstr("d: ")));
}

// As a real kubelet does: a pod waiting for a device is admitted within
// half a second of a holder's delete, before the kubelet has removed the
// holder's pods/<UID> directory and before any reconciliation pass. Every
// device it offers is forgotten: the deleted holder's, and those of pods
// that still run. The pod gets the deleted holder's device, whichever
// order the kubelet offers them in. (Before 1.25 the kubelet allocated
// again for the running pods at re-admission, and so knows their devices.)
TEST_P(ForgottenTest, APodAdmittedRightAfterAHoldersDeleteGetsThatHoldersDevice) {
  std::unique_ptr<ProxyHarness> h = Harness();
  ASSERT_NO_FATAL_FAILURE(Up(*h));
  absl::StatusOr<sim::AllocateResponse> a = h->sim().Allocate(Pod("a", {{"main", 2}}));
  absl::StatusOr<sim::AllocateResponse> b = h->sim().Allocate(Pod("b", {{"main", 1}}));
  absl::StatusOr<sim::AllocateResponse> c = h->sim().Allocate(Pod("c", {{"main", 1}}));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  Learn(*h);
  ASSERT_NO_FATAL_FAILURE(LoseCheckpointAndResync(*h));
  ASSERT_THAT(FailedPods(h->sim().GetState()), IsEmpty());
  // A pass since the kubelet's start has seen the holders listed: one
  // missing from a List now is gone, not yet to be listed.
  Learn(*h);

  // The youngest holder goes: the others' devices come first in the
  // kubelet's order.
  ASSERT_TRUE(h->sim().DeletePod(c->pod_uid()).ok());
  absl::StatusOr<sim::AllocateResponse> n = h->sim().Allocate(Pod("n", {{"main", 1}}));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_THAT(UsedTwice(h->sim().GetState()), IsEmpty());
  EXPECT_THAT(FailedPods(h->sim().GetState()), IsEmpty());
  ASSERT_EQ(n->allocations_size(), 1);
  EXPECT_THAT(n->allocations(0).device_ids(),
              ::testing::ElementsAreArray(c->allocations(0).device_ids()));
}

// At re-admission after a checkpoint loss a kubelet from 1.25 skips the
// containers that run, and allocates again for those that do not (here a
// pod whose container never started: CreateContainerError), through
// GetPreferredAllocation and Allocate. The container runtime says which
// run: the pod that never started is not a holder, and is given its
// devices again; the running pod's device is neither named nor refused,
// and stays held against new pods.
// (Before 1.25 every container is allocated again: ForgottenTest.)
class SkipsRunningTest : public ForgottenTest {};

TEST_P(SkipsRunningTest, APodWhoseContainerNeverStartedIsReadmittedOnFreeDevices) {
  std::unique_ptr<ProxyHarness> h = Harness();
  ASSERT_NO_FATAL_FAILURE(Up(*h));
  absl::StatusOr<sim::AllocateResponse> r = h->sim().Allocate(Pod("r", {{"main", 2}}));
  sim::AllocateRequest never = Pod("x", {{"main", 2}});
  never.mutable_containers(0)->set_never_starts(true);
  absl::StatusOr<sim::AllocateResponse> x = h->sim().Allocate(never);
  ASSERT_TRUE(r.ok() && x.ok());
  Learn(*h);

  const size_t from = h->sim().events().Size();
  ASSERT_NO_FATAL_FAILURE(LoseCheckpointAndResync(*h));
  EXPECT_TRUE(h->sim().events().WaitForEvent("reallocated", {{"pod", "x"}}, absl::ZeroDuration(),
                                             from))
      << "the kubelet allocates again for the container that does not run";
  sim::State st = h->sim().GetState();
  EXPECT_THAT(FailedPods(st), IsEmpty());
  // x's devices in the kubelet's records are none of r's, which r uses.
  std::set<std::string> r_devices(r->allocations(0).device_ids().begin(),
                                  r->allocations(0).device_ids().end());
  for (const auto& a : st.allocations()) {
    if (a.pod_name() != "x") continue;
    for (const std::string& d : a.device_ids()) EXPECT_EQ(r_devices.count(d), 0u) << d;
  }
  EXPECT_THAT(UsedTwice(st), IsEmpty());
  // r's devices stay held: a new pod is refused rather than given one.
  absl::StatusOr<sim::AllocateResponse> n = h->sim().Allocate(Pod("n", {{"main", 1}}));
  EXPECT_FALSE(n.ok());
  EXPECT_THAT(n.status().message(), HasSubstr("pod default/r"));
}

// The kubelet restarts again while pods it forgot still run: its
// pod-resources List is empty for a moment after the start, and that does
// not make their holds lapse.
TEST(ForgottenHoldTest, AKubeletRestartDuringRecoveryKeepsTheHolds) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, ByHand(absl::Seconds(10)));
  ASSERT_NO_FATAL_FAILURE(Up(h));
  ASSERT_TRUE(h.sim().Allocate(Pod("a", {{"main", 2}})).ok());
  ASSERT_TRUE(h.sim().Allocate(Pod("b", {{"main", 1}})).ok());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  ASSERT_NO_FATAL_FAILURE(LoseCheckpointAndResync(h));

  // Again, checkpoint kept this time; a pod arrives before the kubelet has
  // re-admitted the running ones (its List is still empty).
  ASSERT_TRUE(h.sim().Restart().ok());
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_FALSE(h.sim().GetState().pods_synced());
  absl::StatusOr<sim::AllocateResponse> c = h.sim().Allocate(Pod("c", {{"main", 2}}));
  EXPECT_FALSE(c.ok()) << "a pod was given a device two running pods hold";
  EXPECT_THAT(c.status().message(), HasSubstr("still in use by a running container"));
  EXPECT_THAT(UsedTwice(h.sim().GetState()), IsEmpty());
  ASSERT_TRUE(h.sim().WaitForPodsSynced(kWait));
  EXPECT_THAT(FailedPods(h.sim().GetState()), ::testing::ElementsAre(HasSubstr("c: ")));
  // The free device still goes to the next pod.
  absl::StatusOr<sim::AllocateResponse> d = h.sim().Allocate(Pod("d", {{"main", 1}}));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(UsedTwice(h.sim().GetState()), IsEmpty());
  EXPECT_EQ(h.proxy().Status().forgotten.size(), 2u);
}

// The kubelet writes its checkpoint after the plugin's Allocate answers.
// dpproxy read the checkpoint in between, so the last read does not list
// pod a, which runs. The kubelet then restarts without its checkpoint: a's
// devices are forgotten like b's, and no new pod is given one.
TEST(ForgottenHoldTest, AnAllocationTheLastCheckpointReadMissedIsStillHeld) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, ByHand());
  ASSERT_NO_FATAL_FAILURE(Up(h));
  absl::StatusOr<sim::AllocateResponse> b = h.sim().Allocate(Pod("b", {{"main", 1}}));
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());
  h.sim().HoldCheckpointWrites(true);
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("a", {{"main", 2}}));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());  // lists b, not yet a
  h.sim().HoldCheckpointWrites(false);
  ASSERT_NO_FATAL_FAILURE(LoseCheckpointAndResync(h));

  std::vector<std::string> forgotten;
  for (const auto& f : h.proxy().Status().forgotten) {
    forgotten.insert(forgotten.end(), f.devices.begin(), f.devices.end());
  }
  std::vector<std::string> held(a->allocations(0).device_ids().begin(),
                                a->allocations(0).device_ids().end());
  held.push_back(b->allocations(0).device_ids(0));
  EXPECT_THAT(forgotten, ::testing::UnorderedElementsAreArray(held));
  absl::StatusOr<sim::AllocateResponse> n = h.sim().Allocate(Pod("n", {{"main", 1}}));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_THAT(held, Not(::testing::Contains(n->allocations(0).device_ids(0))));
  EXPECT_THAT(UsedTwice(h.sim().GetState()), IsEmpty());
  EXPECT_THAT(FailedPods(h.sim().GetState()), IsEmpty());
}

// A hold whose pod dpproxy knows only by UID (no reconciliation pass named
// it before the loss) lifts once the kubelet removes the pod's directory.
TEST(ForgottenHoldTest, AHoldKnownOnlyByPodUidLiftsWhenItsDirectoryGoes) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, ByHand());
  ASSERT_NO_FATAL_FAILURE(Up(h));
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("a", {{"main", 2}}));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());  // the pod's UID, not its name
  const size_t from = h.proxy().events().Size();
  ASSERT_NO_FATAL_FAILURE(LoseCheckpointAndResync(h));
  ASSERT_EQ(h.proxy().Status().forgotten.size(), 1u);
  EXPECT_EQ(h.proxy().Status().forgotten[0].pod_uid, a->pod_uid());

  const size_t sim_from = h.sim().events().Size();
  ASSERT_TRUE(h.sim().DeletePod(a->pod_uid()).ok());
  ASSERT_TRUE(h.sim().events().WaitForEvent("pod_dir_removed", {{"pod_uid", a->pod_uid()}},
                                            kWait, sim_from));
  absl::StatusOr<sim::AllocateResponse> b = h.sim().Allocate(Pod("b", {{"main", 4}}));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(h.proxy().events().WaitForEvent("forgotten_released", {}, kWait, from));
  EXPECT_TRUE(h.WaitFor([&] { return h.proxy().Status().forgotten.empty(); }));
}

// A kubelet before 1.19 re-admits a running pod onto devices it picks
// itself, another running pod's among them: both pods are kept, the
// kubelet's records no longer match the devices in use, and dpproxy keeps
// holding what each container really uses. When a pod ends, the kubelet
// frees devices another still uses: a new pod given one is refused with
// the holder named.
TEST(ForgottenHoldTest, BeforePreferredAllocationANewPodGivenAHeldDeviceIsRefused) {
  absl::StatusOr<sim::KubeletVersion> v = sim::ParseKubeletVersion("1.18");
  ASSERT_TRUE(v.ok());
  ProxyHarness h(
      v->personality, false,
      [](ProxyConfig& c) {
        c.reconcile_interval = absl::ZeroDuration();
        c.reconcile_grace = absl::Hours(1);
        c.reconcile_start_grace = absl::Seconds(10);
      },
      [&](sim::KubeletSimOptions& o) {
        o.kubelet = *v;
        o.pod_resources = false;
      });
  ASSERT_NO_FATAL_FAILURE(Up(h));
  // b holds gpu-1 and c gpu-0: not in creation order.
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("a", {{"main", 1}}));
  absl::StatusOr<sim::AllocateResponse> b = h.sim().Allocate(Pod("b", {{"main", 1}}));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(h.sim().DeletePod(a->pod_uid()).ok());
  absl::StatusOr<sim::AllocateResponse> c = h.sim().Allocate(Pod("c", {{"main", 1}}));
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(testing::DeviceIdsOf(c->allocations(0)), testing::DeviceIdsOf(a->allocations(0)));
  ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());

  const size_t from = h.proxy().events().Size();
  ASSERT_NO_FATAL_FAILURE(LoseCheckpointAndResync(h));
  EXPECT_THAT(FailedPods(h.sim().GetState()), IsEmpty());
  EXPECT_TRUE(h.proxy().events().WaitForEvent("readmitted_elsewhere", {}, kWait, from));
  EXPECT_THAT(UsedTwice(h.sim().GetState()), IsEmpty());

  // b ends: the kubelet frees the device it recorded for b, which c uses.
  ASSERT_TRUE(h.sim().DeletePod(b->pod_uid()).ok());
  absl::StatusOr<sim::AllocateResponse> d = h.sim().Allocate(Pod("d", {{"main", 3}}));
  EXPECT_FALSE(d.ok()) << "a new pod was given the device c uses";
  EXPECT_THAT(d.status().message(), HasSubstr(c->pod_uid()));
  EXPECT_THAT(UsedTwice(h.sim().GetState()), IsEmpty());
  EXPECT_THAT(FailedPods(h.sim().GetState()), ::testing::ElementsAre(HasSubstr("d: ")));
}

// An init container's devices are reused by the app container; after a
// checkpoint loss only the app container's are held (the init container
// has ended), so a new pod can have the init container's other device.
TEST(ForgottenHoldTest, AnEndedInitContainersDevicesGoToNewPods) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, ByHand());
  ASSERT_NO_FATAL_FAILURE(Up(h));
  sim::AllocateRequest req = Pod("p", {{"setup", 2}, {"main", 1}});
  req.mutable_containers(0)->set_init(true);
  absl::StatusOr<sim::AllocateResponse> p = h.sim().Allocate(req);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->allocations_size(), 2);
  const std::vector<std::string> init = testing::DeviceIdsOf(p->allocations(0));
  const std::vector<std::string> app = testing::DeviceIdsOf(p->allocations(1));
  ASSERT_EQ(app.size(), 1u);
  EXPECT_THAT(init, ::testing::Contains(app[0])) << "the app container reuses the init's device";
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());

  ASSERT_NO_FATAL_FAILURE(LoseCheckpointAndResync(h));
  EXPECT_THAT(FailedPods(h.sim().GetState()), IsEmpty());
  // Three devices are free: the init container's other one among them.
  absl::StatusOr<sim::AllocateResponse> next = h.sim().Allocate(Pod("next", {{"main", 3}}));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT(testing::DeviceIdsOf(next->allocations(0)), Not(::testing::Contains(app[0])));
  EXPECT_THAT(UsedTwice(h.sim().GetState()), IsEmpty());
}

// A container of a pod the kubelet forgot exits and starts again: the
// kubelet allocates again for it, naming no pod; it comes back on free
// devices, never on another pod's.
TEST(ForgottenHoldTest, ARestartingContainerOfAForgottenPodComesBackOnFreeDevices) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, ByHand());
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.devices = 6;
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 6, kWait));
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("a", {{"main", 2}}));
  absl::StatusOr<sim::AllocateResponse> b = h.sim().Allocate(Pod("b", {{"main", 1}}));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  ASSERT_NO_FATAL_FAILURE(LoseCheckpointAndResync(h));

  absl::StatusOr<sim::RestartContainerResponse> r = h.sim().RestartContainer(b->pod_uid(), "main");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->reallocated());
  ASSERT_EQ(r->running_size(), 1);
  EXPECT_THAT(testing::DeviceIdsOf(a->allocations(0)),
              Not(::testing::Contains(r->running(0).device_ids(0))));
  EXPECT_THAT(UsedTwice(h.sim().GetState()), IsEmpty());
  EXPECT_THAT(FailedPods(h.sim().GetState()), IsEmpty());
  // New pods still get only devices nobody uses.
  ASSERT_TRUE(h.sim().Allocate(Pod("c", {{"main", 2}})).ok());
  EXPECT_THAT(UsedTwice(h.sim().GetState()), IsEmpty());
}

// The simulated kubelet and a sample plugin of 2 devices registered with
// it directly, no dpproxy.
void UpDirect(ProxyHarness& h, sample::SamplePlugin** plugin) {
  ASSERT_TRUE(h.sim().Start().ok());
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.kubelet_socket = h.sim().kubelet_socket();
  o.devices = 2;
  *plugin = h.StartPlugin(o);
  ASSERT_NE(*plugin, nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 2, kWait));
}

// What the simulated kubelet does without dpproxy, as a real one does
// (observed on a 1.36.2 node): a plugin registered directly keeps every running
// pod after the checkpoint loss, but the next pod is given a device a
// running pod still uses.
TEST(KubeletSimTest, ADirectPluginHandsARunningPodsDeviceOutAfterACheckpointLoss) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  sample::SamplePlugin* plugin = nullptr;
  ASSERT_NO_FATAL_FAILURE(UpDirect(h, &plugin));
  ASSERT_TRUE(h.sim().Allocate(Pod("a", {{"main", 1}})).ok());
  LoseCheckpoint(h.sim());
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 2, kWait));  // the plugin registered again
  ASSERT_TRUE(h.sim().WaitForPodsSynced(kWait));
  EXPECT_THAT(FailedPods(h.sim().GetState()), IsEmpty());
  ASSERT_TRUE(h.sim().Allocate(Pod("b", {{"main", 1}})).ok());
  ASSERT_TRUE(h.sim().Allocate(Pod("c", {{"main", 1}})).ok());  // 2 devices, 3 pods
  EXPECT_THAT(UsedTwice(h.sim().GetState()), ::testing::SizeIs(1));
}

// And a plugin that reports a running pod's device Unhealthy when the
// kubelet re-admits its pods gets that pod denied and killed.
TEST(KubeletSimTest, UnhealthyDevicesOfRunningPodsGetThemKilledAtReadmission) {
  // Time for the plugin to say so before the kubelet re-admits.
  ProxyHarness h(Personality::kV1Beta1Sync, false, nullptr,
                 [](sim::KubeletSimOptions& o) { o.readmit_delay = absl::Seconds(3); });
  sample::SamplePlugin* plugin = nullptr;
  ASSERT_NO_FATAL_FAILURE(UpDirect(h, &plugin));
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("a", {{"main", 2}}));
  ASSERT_TRUE(a.ok());
  const size_t from = h.sim().events().Size();
  LoseCheckpoint(h.sim());
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 2, kWait));
  ASSERT_TRUE(plugin->SetHealth(a->allocations(0).device_ids(0), "Unhealthy").ok());
  ASSERT_TRUE(h.WaitFor([&] {
    const sim::State st = h.sim().GetState();
    return testing::FindResource(st, kGpu)->allocatable() == 1;
  }));
  ASSERT_FALSE(h.sim().GetState().pods_synced()) << "re-admitted before the plugin spoke";
  ASSERT_TRUE(h.sim().WaitForPodsSynced(kWait));
  ASSERT_TRUE(h.sim().events().WaitForEvent("readmission_denied", {{"pod", "a"}}, kWait, from));
  EXPECT_THAT(FailedPods(h.sim().GetState()),
              ::testing::ElementsAre(HasSubstr("Node didn't have enough resource: vendor.com/gpu, "
                                               "requested: 2, used: 0, capacity: 1")));
}

INSTANTIATE_TEST_SUITE_P(Releases, SkipsRunningTest,
                         ::testing::Values(Release{"1.36", true, false},
                                           Release{"1.26", true, false}),
                         [](const ::testing::TestParamInfo<Release>& info) {
                           return info.param.kubelet[2] == '3' ? std::string("k1_36")
                                                               : std::string("k1_26");
                         });

INSTANTIATE_TEST_SUITE_P(
    Releases, ForgottenTest,
    ::testing::Values(Release{"1.36", true, false}, Release{"1.26", true, false},
                      Release{"1.24", true, true}, Release{"1.18", false, true},
                      Release{"1.9", false, true}),
    [](const ::testing::TestParamInfo<Release>& info) {
      std::string name = absl::StrCat("k", info.param.kubelet);
      for (char& ch : name) {
        if (ch == '.') ch = '_';
      }
      return name;
    });

}  // namespace
}  // namespace dpproxy
