// The saved resources on their own: what a snapshot writes of them reads
// back as the same resources, a published list's bytes become the
// resource's devices, and only a real change is one.
#include "proxy/state/saved_resources.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {
namespace {

state::Resource Head(const std::string& name) {
  state::Resource r;
  r.set_name(name);
  r.set_kubelet_api("v1beta1");
  r.mutable_backend()->set_endpoint("/var/lib/kubelet/device-plugins/" + name + ".sock");
  return r;
}

std::shared_ptr<const std::string> ListOf(const std::vector<std::string>& ids) {
  v1beta1::ListAndWatchResponse list;
  for (const std::string& id : ids) {
    v1beta1::Device* d = list.add_devices();
    d->set_id(id);
    d->set_health("Healthy");
  }
  return std::make_shared<const std::string>(list.SerializeAsString());
}

SavedResources::ToSave ToSave(const std::string& name, std::shared_ptr<const std::string> list) {
  return {Head(name).SerializeAsString(), std::move(list)};
}

// The bytes a snapshot holds for them, read back as a State.
state::State WrittenAndReadBack(const SavedResources& saved) {
  const SavedResources::Fields fields = saved.EncodeFields();
  std::string bytes;
  saved.AppendFields(fields, &bytes);
  EXPECT_EQ(bytes.size(), fields.size);
  state::State back;
  EXPECT_TRUE(back.ParseFromString(bytes));
  return back;
}

TEST(SavedResourcesTest, APublishedListsBytesAreWrittenAsTheResourcesDevices) {
  SavedResources saved;
  std::vector<SavedResources::ToSave> next;
  next.push_back(ToSave("vendor.com/gpu", ListOf({"gpu-0", "gpu-1"})));
  next.push_back(ToSave("vendor.com/nic", nullptr));
  saved.Replace(std::move(next), 1234);
  const state::State back = WrittenAndReadBack(saved);
  ASSERT_EQ(back.resources_size(), 2);
  EXPECT_EQ(back.resources(0).name(), "vendor.com/gpu");
  EXPECT_EQ(back.resources(0).kubelet_api(), "v1beta1");
  ASSERT_EQ(back.resources(0).devices_size(), 2);
  EXPECT_EQ(back.resources(0).devices(1).id(), "gpu-1");
  EXPECT_EQ(back.resources(0).devices(1).health(), "Healthy");
  EXPECT_EQ(back.resources(0).updated_unix_ms(), 1234);
  EXPECT_EQ(back.resources(1).devices_size(), 0);
  // The same through AppendTo (a copy for status and tests).
  state::State copy;
  saved.AppendTo(&copy);
  EXPECT_EQ(copy.SerializeAsString(), back.SerializeAsString());
}

TEST(SavedResourcesTest, WhatALoadTakesIsWrittenBackUnchanged) {
  state::State loaded;
  state::Resource* r = loaded.add_resources();
  *r = Head("vendor.com/gpu");
  r->add_devices()->set_id("gpu-7");
  r->set_updated_unix_ms(99);
  const std::string want = loaded.SerializeAsString();
  SavedResources saved;
  saved.TakeFrom(&loaded);
  EXPECT_EQ(loaded.resources_size(), 0);
  EXPECT_EQ(WrittenAndReadBack(saved).SerializeAsString(), want);
}

TEST(SavedResourcesTest, OnlyARealChangeIsOne) {
  SavedResources saved;
  auto list = ListOf({"gpu-0"});
  std::vector<SavedResources::ToSave> first = {ToSave("vendor.com/gpu", list)};
  saved.Replace(first, 1);
  // The same list's bytes, and an equal list's: the same.
  EXPECT_TRUE(saved.Same({ToSave("vendor.com/gpu", list)}));
  EXPECT_TRUE(saved.Same({ToSave("vendor.com/gpu", ListOf({"gpu-0"}))}));
  // Another device, another head, another count: a change.
  EXPECT_FALSE(saved.Same({ToSave("vendor.com/gpu", ListOf({"gpu-1"}))}));
  EXPECT_FALSE(saved.Same({ToSave("vendor.com/nic", list)}));
  EXPECT_FALSE(saved.Same({}));
  // A resource as a load took it (whole, no list) equals the same
  // resource as a publisher gives it.
  state::State loaded;
  state::Resource* r = loaded.add_resources();
  *r = Head("vendor.com/gpu");
  v1beta1::Device* d = r->add_devices();
  d->set_id("gpu-0");
  d->set_health("Healthy");
  SavedResources from_load;
  from_load.TakeFrom(&loaded);
  EXPECT_TRUE(from_load.Same({ToSave("vendor.com/gpu", list)}));
  from_load.Adopt({ToSave("vendor.com/gpu", list)});
  EXPECT_TRUE(from_load.Same({ToSave("vendor.com/gpu", list)}));
}

}  // namespace
}  // namespace dpproxy
