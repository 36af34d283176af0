// The simulated kubelet's plugin manager on its own (plugin_manager.h):
// each socket in plugins_registry/ registered through the handler of its
// type and told the outcome; deleted and replaced sockets deregistered at
// the next pass, a socket renamed away kept, a failed socket not retried.
// Real registration servers on real Unix sockets; the test runs each pass.
#include "tools/kubelet_sim/plugin_manager.h"

#include <sys/stat.h>

#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/pluginregistration/api.grpc.pb.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr absl::Duration kWait = absl::Seconds(10);

// A plugin's registration socket: answers GetInfo and records the status
// it is told.
class RegistrationSocket final : public pluginregistration::Registration::Service {
 public:
  RegistrationSocket(const std::string& path, const std::string& type, const std::string& name)
      : path_(path) {
    info_.set_type(type);
    info_.set_name(name);
    info_.add_supported_versions("v1beta1");
    grpc::ServerBuilder builder;
    builder.AddListeningPort(UnixAddress(path), grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~RegistrationSocket() override {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
  bool listening() const { return server_ != nullptr; }

  grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                       pluginregistration::PluginInfo* info) override {
    *info = info_;
    return grpc::Status::OK;
  }
  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                        const pluginregistration::RegistrationStatus* status,
                                        pluginregistration::RegistrationStatusResponse*) override {
    absl::MutexLock lock(&mu_);
    statuses_.push_back(*status);
    return grpc::Status::OK;
  }
  // The statuses told so far, once there are `n` (or what there is at the
  // deadline).
  std::vector<pluginregistration::RegistrationStatus> Statuses(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return statuses_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
    return statuses_;
  }

 private:
  const std::string path_;
  pluginregistration::PluginInfo info_;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  std::vector<pluginregistration::RegistrationStatus> statuses_ ABSL_GUARDED_BY(mu_);
};

// Records what the manager asks; refuses names in `refuse`.
class RecordingHandler final : public PluginManager::Handler {
 public:
  std::string RegisterPlugin(const pluginregistration::PluginInfo& info,
                             const std::string& socket_path) override {
    absl::MutexLock lock(&mu_);
    if (refuse.count(info.name()) > 0) return absl::StrCat("refused ", info.name());
    registered.push_back(absl::StrCat(info.name(), "@", socket_path));
    return "";
  }
  void DeregisterPlugin(const std::string& name, const std::string& socket_path) override {
    absl::MutexLock lock(&mu_);
    deregistered.push_back(absl::StrCat(name, "@", socket_path));
  }
  std::vector<std::string> Registered() {
    absl::MutexLock lock(&mu_);
    return registered;
  }
  std::vector<std::string> Deregistered() {
    absl::MutexLock lock(&mu_);
    return deregistered;
  }

  std::set<std::string> refuse;

 private:
  absl::Mutex mu_;
  std::vector<std::string> registered ABSL_GUARDED_BY(mu_);
  std::vector<std::string> deregistered ABSL_GUARDED_BY(mu_);
};

class PluginManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(MakeDirs(dir_).ok());
    ASSERT_TRUE(manager_
                    .Start([this](const std::string& type) -> PluginManager::Handler* {
                      return type == "DevicePlugin" ? &handler_ : nullptr;
                    })
                    .ok());
  }

  // Deletes `path` and waits until the watcher has seen it (its event
  // watcher_socket_deleted; the reconciler acts at its next pass).
  bool Delete(const std::string& path) {
    const size_t mark = events_.Size();
    return ::unlink(path.c_str()) == 0 &&
           events_.WaitForEvent("watcher_socket_deleted", {{"socket", path}}, kWait, mark)
               .has_value();
  }
  size_t Count(const std::string& event) {
    size_t n = 0;
    for (const auto& e : events_.Snapshot()) n += e.value("event", "") == event;
    return n;
  }

  testing::ShortTempDir tmp_;
  const std::string dir_ = tmp_.Sub("plugins_registry");
  EventLog events_{"test"};
  RecordingHandler handler_;
  PluginManager manager_{dir_, absl::Seconds(2), &events_};
};

TEST_F(PluginManagerTest, RegistersEachSocketThroughItsTypesHandlerAndTellsThePlugin) {
  handler_.refuse = {"vendor.com/refused"};
  RegistrationSocket gpu(JoinPath(dir_, "gpu.sock"), "DevicePlugin", "vendor.com/gpu");
  RegistrationSocket refused(JoinPath(dir_, "refused.sock"), "DevicePlugin", "vendor.com/refused");
  RegistrationSocket csi(JoinPath(dir_, "csi.sock"), "CSIPlugin", "csi.example.com");
  ASSERT_TRUE(gpu.listening() && refused.listening() && csi.listening());

  manager_.Reconcile();
  EXPECT_THAT(handler_.Registered(), ElementsAre(absl::StrCat("vendor.com/gpu@", dir_, "/gpu.sock")));
  auto ok = gpu.Statuses(1);
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_TRUE(ok[0].plugin_registered());
  auto no = refused.Statuses(1);
  ASSERT_EQ(no.size(), 1u);
  EXPECT_FALSE(no[0].plugin_registered());
  EXPECT_EQ(no[0].error(), "refused vendor.com/refused");
  auto unknown = csi.Statuses(1);
  ASSERT_EQ(unknown.size(), 1u);
  EXPECT_FALSE(unknown[0].plugin_registered());
  EXPECT_THAT(unknown[0].error(), HasSubstr("no handler registered for plugin type: CSIPlugin"));

  // A second pass changes nothing: a refused socket is not tried again
  // until it is replaced.
  manager_.Reconcile();
  EXPECT_EQ(handler_.Registered().size(), 1u);
  EXPECT_EQ(refused.Statuses(1).size(), 1u);
  EXPECT_THAT(handler_.Deregistered(), IsEmpty());
}

TEST_F(PluginManagerTest, ADeletedSocketIsDeregisteredAndAReplacedOneRegisteredAgain) {
  const std::string path = JoinPath(dir_, "gpu.sock");
  auto gpu = std::make_unique<RegistrationSocket>(path, "DevicePlugin", "vendor.com/gpu");
  manager_.Reconcile();
  ASSERT_EQ(handler_.Registered().size(), 1u);
  ASSERT_TRUE(Delete(path));
  EXPECT_THAT(handler_.Deregistered(), IsEmpty());  // the reconciler acts at its pass
  manager_.Reconcile();
  EXPECT_THAT(handler_.Deregistered(), ElementsAre(absl::StrCat("vendor.com/gpu@", path)));
  gpu.reset();

  // The same path served anew: a new registration.
  RegistrationSocket again(path, "DevicePlugin", "vendor.com/gpu");
  manager_.Reconcile();
  EXPECT_EQ(handler_.Registered().size(), 2u);
  EXPECT_TRUE(again.Statuses(1).at(0).plugin_registered());
}

TEST_F(PluginManagerTest, ASocketRenamedAwayStaysRegistered) {
  const std::string path = JoinPath(dir_, "gpu.sock");
  const std::string other = JoinPath(dir_, "nic.sock");
  RegistrationSocket gpu(path, "DevicePlugin", "vendor.com/gpu");
  RegistrationSocket nic(other, "DevicePlugin", "vendor.com/nic");
  manager_.Reconcile();
  ASSERT_EQ(handler_.Registered().size(), 2u);
  ASSERT_EQ(::rename(path.c_str(), tmp_.Sub("elsewhere.sock").c_str()), 0);
  // The watcher reports events in order: once it has seen the later
  // deletion, it has seen the move too.
  ASSERT_TRUE(Delete(other));
  manager_.Reconcile();
  EXPECT_THAT(handler_.Deregistered(), ElementsAre(absl::StrCat("vendor.com/nic@", other)));
}

TEST_F(PluginManagerTest, ASocketNobodyServesFailsOnceAndIsNotRetried) {
  testing::SilentSocket silent(JoinPath(dir_, "silent.sock"));
  ASSERT_GE(silent.fd(), 0);
  manager_.Reconcile();
  EXPECT_TRUE(events_.WaitForEvent("watcher_registration_failed",
                                   {{"socket", JoinPath(dir_, "silent.sock")}}, kWait));
  EXPECT_EQ(Count("watcher_found"), 1u);
  manager_.Reconcile();
  EXPECT_EQ(Count("watcher_found"), 1u);
  EXPECT_THAT(handler_.Registered(), IsEmpty());
}

}  // namespace
}  // namespace dpproxy::sim
