#include "proxy/core/device_list.h"

#include <string>
#include <vector>

#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {
namespace {

using google::protobuf::util::MessageDifferencer;

v1beta1::Device Dev(const std::string& id, const std::string& health, std::vector<int> numa = {},
                    bool empty_topology = false) {
  v1beta1::Device d;
  d.set_id(id);
  d.set_health(health);
  for (int n : numa) d.mutable_topology()->add_nodes()->set_id(n);
  if (empty_topology) d.mutable_topology();
  return d;
}

v1beta1::ListAndWatchResponse Msg(const std::vector<v1beta1::Device>& devices) {
  v1beta1::ListAndWatchResponse m;
  for (const auto& d : devices) *m.add_devices() = d;
  return m;
}

const std::vector<v1beta1::Device> kDevices = {
    Dev("gpu-0", "Healthy", {0}), Dev("gpu-1", "Unhealthy", {0, 1}), Dev("gpu-2", "Healthy"),
    Dev("gpu-3", "Healthy", {}, /*empty_topology=*/true), Dev("gpu-4", "")};

TEST(DeviceListTest, TheWireIsWhatProtobufWouldSendAndReadsBackTheSame) {
  auto list = DeviceList::FromDevices(kDevices);
  const v1beta1::ListAndWatchResponse want = Msg(kDevices);
  EXPECT_EQ(list->wire(), want.SerializeAsString());
  EXPECT_EQ(list->bytes(), want.ByteSizeLong());
  v1beta1::ListAndWatchResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(list->wire()));
  EXPECT_TRUE(MessageDifferencer::Equals(parsed, want));
  EXPECT_TRUE(MessageDifferencer::Equals(list->ToMessage(), want));
  // The kubelet tells a device with no topology from one with an empty one.
  EXPECT_TRUE(parsed.devices(3).has_topology());
  EXPECT_FALSE(parsed.devices(2).has_topology());
  ASSERT_EQ(list->size(), 5);
  for (int i = 0; i < list->size(); ++i) {
    EXPECT_TRUE(MessageDifferencer::Equals(list->ToDevice(i), kDevices[static_cast<size_t>(i)]))
        << i;
  }
}

TEST(DeviceListTest, ViewsFindsAndCounts) {
  auto list = DeviceList::FromDevices(kDevices);
  EXPECT_EQ(list->healthy(), 3);
  EXPECT_EQ(list->device(1).id, "gpu-1");
  EXPECT_EQ(list->device(1).health, "Unhealthy");
  EXPECT_TRUE(list->device(1).has_topology);
  EXPECT_EQ(list->device(4).health, "");
  for (int i = 0; i < list->size(); ++i) {
    ASSERT_TRUE(list->Find(kDevices[static_cast<size_t>(i)].id()).has_value());
    EXPECT_EQ(*list->Find(kDevices[static_cast<size_t>(i)].id()), i);
  }
  EXPECT_FALSE(list->Find("gpu-9").has_value());
  EXPECT_FALSE(list->Find("").has_value());
  EXPECT_FALSE(list->Contains("gpu-"));
  EXPECT_TRUE(DeviceList::Empty()->empty());
  EXPECT_EQ(DeviceList::Empty()->bytes(), 0u);
}

TEST(DeviceListTest, LargeListsIndexEveryDevice) {
  std::vector<v1beta1::Device> many;
  for (int i = 0; i < 20000; ++i) {
    // Long IDs so that entries need two-byte lengths.
    many.push_back(Dev(absl::StrCat("device-", i, "-", std::string(130, 'x')), "Healthy", {i % 2}));
  }
  const v1beta1::ListAndWatchResponse want = Msg(many);
  auto list = DeviceList::FromDevices(many);
  EXPECT_EQ(list->wire(), want.SerializeAsString());
  for (int i = 0; i < 20000; i += 997) {
    EXPECT_EQ(list->Find(many[static_cast<size_t>(i)].id()), i);
  }
  EXPECT_EQ(list->healthy(), 20000);
}

TEST(DeviceListTest, WithHealthChangesOnlyWhatDiffersAndSharesWhenNothingDoes) {
  auto list = DeviceList::FromDevices(kDevices);
  auto same = list->WithHealth([](const DeviceList::View& d) {
    return d.id == "gpu-1" ? absl::string_view("Unhealthy") : absl::string_view();
  });
  EXPECT_EQ(same.get(), list.get());

  auto changed = list->WithHealth([](const DeviceList::View& d) {
    return d.id == "gpu-0" ? absl::string_view("Unhealthy") : absl::string_view();
  });
  ASSERT_NE(changed.get(), list.get());
  std::vector<v1beta1::Device> want = kDevices;
  want[0].set_health("Unhealthy");
  EXPECT_EQ(changed->wire(), Msg(want).SerializeAsString());
  EXPECT_EQ(changed->healthy(), 2);
  EXPECT_EQ(changed->Find("gpu-4"), 4);
  EXPECT_EQ(list->healthy(), 3);  // the original is untouched
}

TEST(DeviceListTest, SharedWireKeepsTheListAlive) {
  std::shared_ptr<const std::string> wire;
  {
    auto list = DeviceList::FromDevices(kDevices);
    wire = list->shared_wire();
  }
  v1beta1::ListAndWatchResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(*wire));
  EXPECT_EQ(parsed.devices_size(), 5);
}

}  // namespace
}  // namespace dpproxy

namespace dpproxy {
namespace {

TEST(DeviceListFromWireTest, ReadsWhatAPluginSendsAsProtobufWould) {
  v1beta1::ListAndWatchResponse sent = Msg(kDevices);
  auto list = DeviceList::FromWire(sent.SerializeAsString());
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ((*list)->wire(), sent.SerializeAsString());
  EXPECT_EQ((*list)->Find("gpu-3"), 3);
  EXPECT_TRUE((*list)->device(3).has_topology);
}

TEST(DeviceListFromWireTest, V1AlphaReadingDropsTopology) {
  auto list = DeviceList::FromWire(Msg(kDevices).SerializeAsString(), /*with_topology=*/false);
  ASSERT_TRUE(list.ok()) << list.status();
  for (int i = 0; i < (*list)->size(); ++i) EXPECT_FALSE((*list)->device(i).has_topology) << i;
  EXPECT_EQ((*list)->device(1).health, "Unhealthy");
}

TEST(DeviceListFromWireTest, UnknownFieldsAreDroppedAndMalformedBytesNamed) {
  v1beta1::ListAndWatchResponse sent = Msg({Dev("gpu-0", "Healthy")});
  std::string wire = sent.SerializeAsString();
  // An unknown varint field 9 at the top and inside the device.
  std::string with_unknown = wire + std::string("\x48\x05", 2);
  with_unknown.insert(2, std::string("\x48\x07", 2));
  with_unknown[1] = static_cast<char>(with_unknown[1] + 2);
  auto list = DeviceList::FromWire(with_unknown);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ((*list)->wire(), wire);

  auto cut = DeviceList::FromWire(wire.substr(0, wire.size() - 3));
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cut.status().message().find("device 0"), absl::string_view::npos) << cut.status();

  v1beta1::ListAndWatchResponse bad_utf8 = Msg({Dev("gpu-0", "Healthy")});
  std::string bytes = bad_utf8.SerializeAsString();
  bytes[4] = static_cast<char>(0xff);  // inside the ID
  auto not_utf8 = DeviceList::FromWire(bytes);
  ASSERT_FALSE(not_utf8.ok());
  EXPECT_NE(not_utf8.status().message().find("UTF-8"), absl::string_view::npos);
}

TEST(DeviceListBuilderTest, CopiesViewsFromOtherLists) {
  auto a = DeviceList::FromDevices(kDevices);
  DeviceList::Builder b;
  b.Add(a->device(2));
  DeviceList::View renamed = a->device(0);
  renamed.id = "renamed";
  b.Add(renamed);
  auto built = std::move(b).Build();
  a.reset();
  ASSERT_EQ(built->size(), 2);
  EXPECT_EQ(built->device(0).id, "gpu-2");
  EXPECT_EQ(built->device(1).id, "renamed");
  EXPECT_TRUE(built->device(1).has_topology);
  EXPECT_EQ(built->Find("renamed"), 1);
}

}  // namespace
}  // namespace dpproxy
