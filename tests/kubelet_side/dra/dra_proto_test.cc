// Our DRA .proto files against the facts (kubernetes/kubelet pkg/apis/dra): the service
// names the kubelet dials, and the wire numbers of every field, checked on
// bytes so that a renumbered field fails here and not on a node.
#include "gtest/gtest.h"
#include "proto/dra/v1/api.grpc.pb.h"
#include "proto/dra/v1beta1/api.grpc.pb.h"
#include "proto/dra_health/v1/api.grpc.pb.h"
#include "proto/dra_health/v1alpha1/api.grpc.pb.h"

namespace dpproxy {
namespace {

namespace v1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace v1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

TEST(DraProtoTest, ServicesAreTheOnesTheKubeletCalls) {
  EXPECT_STREQ(v1::DRAPlugin::service_full_name(), "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin");
  EXPECT_STREQ(v1beta1::DRAPlugin::service_full_name(),
               "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin");
  const auto* s = v1::Claim::descriptor()->file()->FindServiceByName("DRAPlugin");
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(s->method_count(), 2);
  EXPECT_EQ(s->method(0)->name(), "NodePrepareResources");
  EXPECT_EQ(s->method(1)->name(), "NodeUnprepareResources");
}

// Field numbers from the facts, as protobuf encodes them (tag = number << 3
// | wire type 2 for strings, messages and map entries).
TEST(DraProtoTest, FieldNumbersMatchTheFacts) {
  v1::Claim claim;
  claim.set_namespace_("n");
  claim.set_uid("u");
  claim.set_name("m");
  EXPECT_EQ(claim.SerializeAsString(), std::string("\x0a\x01n\x12\x01u\x1a\x01m", 9));

  v1::Device d;
  d.add_request_names("r");
  d.set_pool_name("p");
  d.set_device_name("d");
  d.add_cdi_device_ids("c");
  d.set_share_id("s");
  EXPECT_EQ(d.SerializeAsString(), std::string("\x0a\x01r\x12\x01p\x1a\x01" "d\x22\x01" "c\x2a\x01s", 15));

  v1::NodePrepareResourceResponse prepared;
  prepared.set_error("e");
  EXPECT_EQ(prepared.SerializeAsString(), std::string("\x12\x01" "e", 3));
  v1::NodeUnprepareResourceResponse unprepared;
  unprepared.set_error("e");
  EXPECT_EQ(unprepared.SerializeAsString(), std::string("\x0a\x01" "e", 3));

  // Maps keyed by claim UID, field 1 of both responses.
  v1::NodePrepareResourcesResponse all;
  (*all.mutable_claims())["u"].set_error("e");
  EXPECT_EQ(all.SerializeAsString(), std::string("\x0a\x08\x0a\x01u\x12\x03\x12\x01" "e", 10));
}

// The health stream: the method paths a 1.36 kubelet (v1alpha1) and a
// 1.37 one (v1) call, over the same messages, and DeviceHealth's numbers
// as the facts give them.
TEST(DraProtoTest, TheHealthStreamIsWhereAndWhatTheKubeletReads) {
  namespace health = ::v1alpha1;
  EXPECT_STREQ(health::DRAResourceHealth::service_full_name(), "v1alpha1.DRAResourceHealth");
  EXPECT_STREQ(::v1::DRAResourceHealth::service_full_name(), "v1.DRAResourceHealth");
  const auto* v1s = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      "v1.DRAResourceHealth");
  ASSERT_NE(v1s, nullptr);
  ASSERT_EQ(v1s->method_count(), 1);
  EXPECT_EQ(v1s->method(0)->name(), "NodeWatchResources");
  EXPECT_TRUE(v1s->method(0)->server_streaming());
  EXPECT_EQ(v1s->method(0)->output_type(), health::NodeWatchResourcesResponse::descriptor());
  const auto* s = health::DeviceHealth::descriptor()->file()->FindServiceByName(
      "DRAResourceHealth");
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(s->method_count(), 1);
  EXPECT_EQ(s->method(0)->name(), "NodeWatchResources");
  EXPECT_TRUE(s->method(0)->server_streaming());
  health::DeviceHealth h;
  h.mutable_device()->set_pool_name("p");
  h.mutable_device()->set_device_name("d");
  h.set_health(health::UNHEALTHY);
  h.set_last_updated_time(7);
  h.set_health_check_timeout_seconds(9);
  h.set_message("m");
  // device = 1 {pool_name = 1, device_name = 2}, health = 2 (UNHEALTHY 2),
  // last_updated_time = 3, health_check_timeout_seconds = 4, message = 5.
  EXPECT_EQ(h.SerializeAsString(),
            std::string("\x0a\x06\x0a\x01p\x12\x01" "d" "\x10\x02\x18\x07\x20\x09\x2a\x01m", 17));
  EXPECT_EQ(health::UNKNOWN, 0);
  EXPECT_EQ(health::HEALTHY, 1);
}

// v1 and v1beta1 are the same messages: bytes of one parse as the other.
TEST(DraProtoTest, V1AndV1Beta1AreTheSameOnTheWire) {
  v1beta1::NodePrepareResourcesRequest req;
  auto* c = req.add_claims();
  c->set_namespace_("default");
  c->set_uid("5b1f");
  c->set_name("gpu-claim");
  v1::NodePrepareResourcesRequest same;
  ASSERT_TRUE(same.ParseFromString(req.SerializeAsString()));
  ASSERT_EQ(same.claims_size(), 1);
  EXPECT_EQ(same.claims(0).uid(), "5b1f");
  EXPECT_EQ(same.claims(0).name(), "gpu-claim");
}

}  // namespace
}  // namespace dpproxy
