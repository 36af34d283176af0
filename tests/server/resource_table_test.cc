// ResourceTable: one entry per kubelet-facing name whoever adds it first,
// the facts a backend attaching or a restore sets, and the configuration
// as reloads leave it.
#include "proxy/server/resource_table.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "proxy/core/resource.h"

namespace dpproxy {
namespace {

std::unique_ptr<ServedResource> Made(const std::string& name, EventLog* events) {
  auto e = std::make_unique<ServedResource>();
  e->resource = std::make_unique<Resource>(name, ResourcePolicy(), events, ResourceHooks());
  return e;
}

TEST(ResourceTableTest, TheFirstAddWinsAndTheOtherIsHandedTheWinner) {
  EventLog events("test");
  ResourceTable table{ProxyConfig()};
  constexpr int kThreads = 8;
  std::vector<ServedResource*> got(kThreads);
  std::vector<int> won(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto [e, added] = table.Add("example.com/gpu", Made("example.com/gpu", &events));
      got[i] = e;
      won[i] = added;
    });
  }
  for (std::thread& t : threads) t.join();
  int winners = 0;
  for (int i = 0; i < kThreads; ++i) {
    winners += won[i];
    EXPECT_EQ(got[i], got[0]);
  }
  EXPECT_EQ(winners, 1);
  EXPECT_EQ(table.All().size(), 1u);
  EXPECT_EQ(table.Find("example.com/gpu"), got[0]);
  EXPECT_EQ(table.Find("example.com/nic"), nullptr);
}

TEST(ResourceTableTest, FactsAreKeptPerEntryAndGoWithIt) {
  EventLog events("test");
  ResourceTable table{ProxyConfig()};
  ServedResource* gpu = table.Add("b/gpu", Made("b/gpu", &events)).first;
  ServedResource* nic = table.Add("a/nic", Made("a/nic", &events)).first;
  table.SetRestored(gpu, {"vendor/gpu", "v1beta1"});
  table.SetBackendResource(nic, "vendor/nic");
  EXPECT_EQ(table.facts(gpu).backend_resource, "vendor/gpu");
  EXPECT_EQ(table.facts(gpu).restored_kubelet_api, "v1beta1");
  EXPECT_EQ(table.facts(nic).backend_resource, "vendor/nic");
  const auto all = table.AllWithFacts();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, nic);  // in order of name
  EXPECT_EQ(all[1].second.backend_resource, "vendor/gpu");
  auto taken = table.TakeAll();
  EXPECT_EQ(taken.size(), 2u);
  EXPECT_TRUE(table.All().empty());
  EXPECT_EQ(table.facts(gpu).backend_resource, "");
}

TEST(ResourceTableTest, ServedNamesFollowTheLiveConfiguration) {
  ResourceTable table{ProxyConfig()};
  EXPECT_EQ(table.ServedName("vendor/gpu"), "vendor/gpu");
  const uint64_t before = table.served_version();
  table.UpdateLive([](ProxyConfig& c) { c.renames["vendor/gpu"] = "example.com/gpu"; });
  table.NoteServedChange();
  EXPECT_EQ(table.ServedName("vendor/gpu"), "example.com/gpu");
  EXPECT_EQ(table.live().renames.at("vendor/gpu"), "example.com/gpu");
  EXPECT_GT(table.served_version(), before);
}

}  // namespace
}  // namespace dpproxy
