#include "proxy/core/preferred.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dpproxy {
namespace {

using ::testing::ElementsAre;

v1beta1::ContainerPreferredAllocationRequest Request(std::vector<std::string> available,
                                                     std::vector<std::string> must, int size) {
  v1beta1::ContainerPreferredAllocationRequest r;
  for (auto& id : available) r.add_available_deviceids(id);
  for (auto& id : must) r.add_must_include_deviceids(id);
  r.set_allocation_size(size);
  return r;
}

const std::map<std::string, std::string> kHeld = {{"d0", "default/a/main"},
                                                  {"d1", "default/a/main"}};

TEST(ChoosePreferredTest, HeldDevicesAreLeftOutWhileOthersSuffice) {
  PreferredChoice c = ChoosePreferred(Request({"d0", "d1", "d2", "d3"}, {}, 2), {}, kHeld);
  EXPECT_THAT(c.ids, ElementsAre("d2", "d3"));
  EXPECT_EQ(c.avoided, 2);
  EXPECT_EQ(c.held_named, 0);
}

TEST(ChoosePreferredTest, AlwaysExactlyTheSizeAskedHeldLast) {
  // The kubelet would top a short answer up from any device, held ones
  // included: the answer names the held one itself, last.
  PreferredChoice c = ChoosePreferred(Request({"d0", "d1", "d2"}, {}, 2), {}, kHeld);
  EXPECT_THAT(c.ids, ElementsAre("d2", "d0"));
  EXPECT_EQ(c.held_named, 1);
  EXPECT_EQ(c.avoided, 1);
}

TEST(ChoosePreferredTest, MustIncludeComesFirstEvenWhenHeld) {
  // An init container's device, reused by the app container.
  PreferredChoice c = ChoosePreferred(Request({"d0", "d2", "d3"}, {"d0"}, 2), {}, kHeld);
  EXPECT_THAT(c.ids, ElementsAre("d0", "d2"));
}

TEST(ChoosePreferredTest, TheBackendsFreePicksComeBeforeTheRest) {
  PreferredChoice c =
      ChoosePreferred(Request({"d0", "d1", "d2", "d3", "d4"}, {}, 2), {"d1", "d4", "d3"}, kHeld);
  EXPECT_THAT(c.ids, ElementsAre("d4", "d3"));
}

TEST(ChoosePreferredTest, OnlyAvailableDevicesAndNoMoreThanThere) {
  PreferredChoice c = ChoosePreferred(Request({"d2"}, {}, 3), {"d9"}, kHeld);
  EXPECT_THAT(c.ids, ElementsAre("d2"));
}

}  // namespace
}  // namespace dpproxy
