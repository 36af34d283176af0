// The status model: one structure behind the status file, `dpproxy status`
// and the metrics.
#include "proxy/status/status_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "proxy/server/metrics.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ProxyStatus Example() {
  ProxyStatus st;
  st.pid = 4242;
  st.kubelet_root = "/var/lib/kubelet";
  st.plugin_socket = "/var/lib/dpproxy/device-plugins/kubelet.sock";
  ResourceStatus gpu;
  gpu.resource = "vendor.com/gpu";
  gpu.kubelet_api = "v1beta1";
  gpu.backend_connected = true;
  gpu.backend_api = "v1alpha2";
  gpu.backend_endpoint = "/var/lib/dpproxy/device-plugins/gpu.sock";
  gpu.devices_total = 2;
  gpu.devices_healthy = 1;
  gpu.device_list_bytes = 60;
  gpu.devices = {{"gpu-0", "Healthy"}, {"gpu-1", "Unhealthy"}};
  ResourceStatus nic;
  nic.resource = "vendor.com/nic";
  nic.devices_total = 100000;
  nic.device_list_bytes = 5 << 20;
  nic.device_list_too_large = true;
  st.resources = {gpu, nic};
  st.lossy_translations["vendor.com/gpu"]["topology"] = 3;
  st.state = StateStatus{"/var/lib/dpproxy/state.pb", 7, 1, false, "disk full", 9, 12, 2};
  ForgottenStatus q;
  q.resource = "vendor.com/gpu";
  q.allocation = 5;
  q.devices = {"gpu-1"};
  q.pod = "default/trainer";
  q.container = "main";
  q.reason = "the kubelet restarted and lost it";
  st.forgotten = {q};
  st.devices_held_twice = 1;
  st.allocations_recovered = 5;
  st.allocations_recovered_by_source = {{"kubelet_checkpoint", 3}, {"pod_resources", 2}};
  st.allocations_unrecoverable = 1;
  st.registrations_rejected["version"] = 2;
  st.not_ready = {{"state-writable", false, "disk full"}};
  return st;
}

TEST(StatusModelTest, TheStatusFileReadsBackAsWritten) {
  const ProxyStatus st = Example();
  const Json json = StatusToJson(st);
  // The keys other tools read.
  EXPECT_EQ(json["resources"][0]["devices"][1]["health"], "Unhealthy");
  EXPECT_EQ(json["state"]["writable"], false);
  EXPECT_EQ(json["forgotten"][0]["pod"], "default/trainer");
  EXPECT_EQ(json["ready"], false);
  EXPECT_EQ(json["not_ready"][0]["check"], "state-writable");
  absl::StatusOr<ProxyStatus> back = StatusFromJson(Json::parse(json.dump()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(StatusToJson(*back), json);
  ASSERT_NE(back->Find("vendor.com/nic"), nullptr);
  EXPECT_TRUE(back->Find("vendor.com/nic")->device_list_too_large);
  EXPECT_EQ(back->Find("vendor.com/fpga"), nullptr);
}

TEST(StatusModelTest, DraModeIsShownReadBackAndTold) {
  ProxyStatus st = Example();
  st.dra = DraStatus{"gpu.vendor.com", "node-1", "resource.k8s.io/v1",
                     "/var/lib/kubelet/plugins_registry/gpu.vendor.com-reg.sock", false,
                     "cannot publish vendor.com/gpu's devices: connection refused"};
  const Json json = StatusToJson(st);
  EXPECT_EQ(json["dra"]["driver"], "gpu.vendor.com");
  absl::StatusOr<ProxyStatus> back = StatusFromJson(Json::parse(StatusFileText(st)));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(StatusToJson(*back), json);
  EXPECT_THAT(StatusTable(st), HasSubstr("DRA driver gpu.vendor.com on node node-1 "
                                         "(resource.k8s.io/v1): NOT registered"));
  EXPECT_THAT(StatusTable(st), HasSubstr("API server: cannot publish vendor.com/gpu's devices"));
  st.dra->registered = true;
  st.dra->api_error.clear();
  EXPECT_THAT(StatusTable(st), HasSubstr("registered with the kubelet"));
  EXPECT_THAT(StatusTable(st), Not(HasSubstr("API server:")));
  EXPECT_TRUE(StatusToJson(Example())["dra"].is_null());  // outside DRA mode
}

TEST(StatusModelTest, TheFileTextIsTheJsonWrittenPieceByPiece) {
  ProxyStatus st = Example();
  st.resources[1].devices = {{"nic-\"quoted\"\\0", "Healthy"}};  // escaped as JSON
  st.resources.push_back(ResourceStatus());  // no devices at all
  const std::string text = StatusFileText(st);
  EXPECT_EQ(text.back(), '\n');
  const Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(parsed.is_discarded()) << text;
  EXPECT_EQ(parsed, StatusToJson(st));
  ProxyStatus none;
  EXPECT_EQ(Json::parse(StatusFileText(none)), StatusToJson(none));
}

TEST(StatusModelTest, AFileFromAnOlderDpproxyStillReads) {
  // Written before the journal counters and the rejections were reported,
  // and without a state directory.
  const Json old = Json::parse(R"({"pid": 7, "resources": [{"resource": "a.com/x",
      "devices_total": 3, "devices_healthy": 3}], "state": null})");
  absl::StatusOr<ProxyStatus> st = StatusFromJson(old);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->resources[0].devices_total, 3);
  EXPECT_EQ(st->resources[0].kubelet_api, "");
  EXPECT_FALSE(st->state.has_value());
  EXPECT_TRUE(st->registrations_rejected.empty());
}

TEST(StatusModelTest, SomethingElseIsRefusedWithTheReason) {
  EXPECT_THAT(std::string(StatusFromJson(Json::parse("[1,2]")).status().message()),
              HasSubstr("not a dpproxy status"));
  EXPECT_THAT(std::string(StatusFromJson(Json::parse(R"({"resources": 3})")).status().message()),
              HasSubstr("not a dpproxy status"));
}

TEST(StatusModelTest, TheTableSaysWhatNeedsAttention) {
  const std::string table = StatusTable(Example());
  EXPECT_THAT(table, HasSubstr("dpproxy pid 4242"));
  EXPECT_THAT(table, HasSubstr("NOT READY:\n  state-writable: disk full\n"));
  EXPECT_THAT(table, HasSubstr("vendor.com/gpu"));
  EXPECT_THAT(table, HasSubstr("1/2 healthy"));
  EXPECT_THAT(table, HasSubstr("(not registered)"));  // the nic
  EXPECT_THAT(table, HasSubstr("DEVICE LIST TOO LARGE for the kubelet: 5242880 bytes"));
  EXPECT_THAT(table, HasSubstr("NOT WRITABLE (every Allocate is refused until it is): disk full"));
  EXPECT_THAT(table, HasSubstr("FORGOTTEN BY THE KUBELET"));
  EXPECT_THAT(table, HasSubstr("vendor.com/gpu gpu-1 held by default/trainer/main"));
  EXPECT_THAT(table, HasSubstr("1 device(s) found held by two pods"));
  EXPECT_THAT(table, HasSubstr("LEARNED BACK after damage: 5 allocation(s) (3 from "
                               "kubelet_checkpoint, 2 from pod_resources); 1 could not be"));
  ProxyStatus quiet = Example();
  quiet.allocations_recovered = 0;
  quiet.allocations_unrecoverable = 0;
  quiet.forgotten.clear();
  quiet.devices_held_twice = 0;
  quiet.state->writable = true;
  quiet.not_ready.clear();
  quiet.resources.pop_back();
  const std::string calm = StatusTable(quiet);
  EXPECT_THAT(calm, Not(HasSubstr("FORGOTTEN BY THE KUBELET")));
  EXPECT_THAT(calm, Not(HasSubstr("TOO LARGE")));
  EXPECT_THAT(calm, Not(HasSubstr("LEARNED BACK")));
  EXPECT_THAT(calm, HasSubstr("\nready\n"));
  EXPECT_THAT(calm, HasSubstr(", writable, 1 failed write(s)"));
}

TEST(MetricsTest, FamiliesComeFromTheStatus) {
  EventLog events("test");
  events.Emit("allocate", {{"resource", "vendor.com/gpu"}});
  events.Emit("kubelet_registered", {{"resource", "vendor.com/gpu"}});
  events.Emit("backend_registration_rejected", {{"resource", "evil.com/x\"y"}});
  events.Emit("kubelet_registered", {{"resource", "evil.com/unserved"}});
  int scrapes = 0;
  ProxyMetrics metrics(
      [&] {
        ++scrapes;
        ProxyStatus st = Example();
        st.resources[0].devices.clear();  // what Status(false) gives
        return st;
      },
      &events);
  const std::string text = metrics.Text();
  EXPECT_EQ(scrapes, 1);
  EXPECT_THAT(text, HasSubstr(
      "dpproxy_devices{resource=\"vendor.com/gpu\",health=\"healthy\"} 1"));
  EXPECT_THAT(text, HasSubstr(
      "dpproxy_devices{resource=\"vendor.com/gpu\",health=\"unhealthy\"} 1"));
  EXPECT_THAT(text, HasSubstr(
      "dpproxy_kubelet_registered{resource=\"vendor.com/nic\"} 0"));
  EXPECT_THAT(text, HasSubstr("dpproxy_resource_info{resource=\"vendor.com/gpu\","
                              "kubelet_api=\"v1beta1\",backend_api=\"v1alpha2\"} 1"));
  EXPECT_THAT(text, HasSubstr("process_cpu_seconds_total "));
  EXPECT_THAT(text, HasSubstr("process_max_fds "));
  EXPECT_THAT(text, HasSubstr("dpproxy_device_list_bytes{resource=\"vendor.com/nic\"} 5242880"));
  EXPECT_THAT(text, HasSubstr("dpproxy_forgotten_devices{resource=\"vendor.com/gpu\"} 1"));
  EXPECT_THAT(text, HasSubstr(
      "dpproxy_lossy_translations_total{resource=\"vendor.com/gpu\",kind=\"topology\"} 3"));
  EXPECT_THAT(text, HasSubstr(
      "dpproxy_backend_registrations_rejected_total{reason=\"version\"} 2"));
  EXPECT_THAT(text, HasSubstr("dpproxy_journal_writes_total 9"));
  EXPECT_THAT(text,
              HasSubstr("dpproxy_allocations_recovered_total{source=\"pod_resources\"} 2"));
  EXPECT_THAT(text, HasSubstr("dpproxy_allocations_unrecoverable_total 1"));
  EXPECT_THAT(text, HasSubstr("dpproxy_journal_records_total 12"));
  EXPECT_THAT(text, HasSubstr("dpproxy_state_save_failures_total 1"));
  EXPECT_THAT(text, HasSubstr(
      "dpproxy_kubelet_registrations_total{resource=\"vendor.com/gpu\",result=\"ok\"} 1"));
  EXPECT_THAT(text, HasSubstr(
      "dpproxy_kubelet_registrations_total{resource=\"vendor.com/nic\",result=\"failed\"} 0"));
  // A name from a refused registration never becomes a label.
  EXPECT_THAT(text, Not(HasSubstr("evil")));
  EXPECT_THAT(text, HasSubstr("dpproxy_build_info{version=\""));
  // Without a state directory there is no state to report.
  ProxyMetrics stateless([] { ProxyStatus st; return st; }, &events);
  EXPECT_THAT(stateless.Text(), Not(HasSubstr("dpproxy_journal")));
}

}  // namespace
}  // namespace dpproxy
