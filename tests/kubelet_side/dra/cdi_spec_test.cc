#include "proxy/kubelet_side/dra/cdi_spec.h"

#include <sys/stat.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

PreparedDevice Gpu(const std::string& name, int index) {
  PreparedDevice d;
  d.device_name = name;
  auto& r = d.response;
  (*r.mutable_envs())["VISIBLE_GPUS"] = std::to_string(index);
  (*r.mutable_envs())["A_FIRST"] = "1";
  auto* n = r.add_devices();
  n->set_container_path("/dev/gpu" + std::to_string(index));
  n->set_host_path("/dev/gpu" + std::to_string(index));
  n->set_permissions("rw");
  auto* m = r.add_mounts();
  m->set_container_path("/usr/lib/gpu");
  m->set_host_path("/opt/gpu/lib");
  m->set_read_only(true);
  (*r.mutable_annotations())["vendor.com/note"] = "x";
  return d;
}

// docs/dra.md's mapping, field by field.
TEST(CdiSpecTest, EachDeviceGetsTheEditsOfItsAllocateAnswer) {
  PreparedDevice only_cdi;
  only_cdi.device_name = "nic-0";
  only_cdi.response.add_cdi_devices()->set_name("vendor.com/nic=0");
  absl::StatusOr<ClaimCdiSpec> s =
      BuildClaimCdiSpec("gpu.vendor.com", "5b1f", {Gpu("gpu-0", 0), Gpu("gpu-1", 1), only_cdi});
  ASSERT_TRUE(s.ok()) << s.status();
  const Json j = Json::parse(s->json);
  EXPECT_EQ(j["cdiVersion"], kCdiVersion);
  EXPECT_EQ(j["kind"], "gpu.vendor.com/claim");
  ASSERT_EQ(j["devices"].size(), 2u);  // nic-0 has no edits of its own
  const Json& d0 = j["devices"][0];
  EXPECT_EQ(d0["name"], "5b1f-gpu-0");
  EXPECT_EQ(d0["containerEdits"]["env"], Json({"A_FIRST=1", "VISIBLE_GPUS=0"}));  // sorted
  EXPECT_EQ(d0["containerEdits"]["deviceNodes"],
            Json::parse(R"([{"path":"/dev/gpu0","hostPath":"/dev/gpu0","permissions":"rw"}])"));
  EXPECT_EQ(d0["containerEdits"]["mounts"],
            Json::parse(R"([{"hostPath":"/opt/gpu/lib","containerPath":"/usr/lib/gpu",
                             "options":["bind","ro"]}])"));
  EXPECT_EQ(j["devices"][1]["name"], "5b1f-gpu-1");
  ASSERT_EQ(s->cdi_device_ids.size(), 3u);
  EXPECT_THAT(s->cdi_device_ids[0], ElementsAre("gpu.vendor.com/claim=5b1f-gpu-0"));
  EXPECT_THAT(s->cdi_device_ids[1], ElementsAre("gpu.vendor.com/claim=5b1f-gpu-1"));
  EXPECT_THAT(s->cdi_device_ids[2], ElementsAre("vendor.com/nic=0"));  // passed through
  EXPECT_EQ(s->loss.annotations, 2);  // one per GPU: CDI has no container annotations
  // The same answer always gives the same bytes (prepare is repeated).
  EXPECT_EQ(BuildClaimCdiSpec("gpu.vendor.com", "5b1f", {Gpu("gpu-0", 0), Gpu("gpu-1", 1), only_cdi})
                ->json,
            s->json);
}

TEST(CdiSpecTest, WhatARuntimeWouldRefuseIsRefusedHereNamingIt) {
  PreparedDevice rel = Gpu("gpu-0", 0);
  rel.response.mutable_devices(0)->set_container_path("dev/gpu0");
  absl::StatusOr<ClaimCdiSpec> s = BuildClaimCdiSpec("gpu.vendor.com", "u", {rel});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("gpu-0"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("not absolute"));
  PreparedDevice env = Gpu("gpu-1", 1);
  (*env.response.mutable_envs())["A=B"] = "c";
  s = BuildClaimCdiSpec("gpu.vendor.com", "u", {env});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("env name \"A=B\""));
}

TEST(CdiSpecTest, SpecsAreWrittenWholeReadableAndRemovedOnce) {
  testing::ShortTempDir dir;
  const std::string cdi = dir.Sub("cdi");  // created on first write
  absl::StatusOr<ClaimCdiSpec> s = BuildClaimCdiSpec("gpu.vendor.com", "5b1f", {Gpu("gpu-0", 0)});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(WriteClaimCdiSpec(cdi, "gpu.vendor.com", "5b1f", s->json).ok());
  const std::string path = ClaimCdiSpecPath(cdi, "gpu.vendor.com", "5b1f");
  EXPECT_EQ(path, cdi + "/dpproxy-gpu.vendor.com-5b1f.json");
  absl::StatusOr<std::string> read = ReadFile(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, s->json);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  // Written again (a repeated prepare): replaced, nothing left beside it.
  ASSERT_TRUE(WriteClaimCdiSpec(cdi, "gpu.vendor.com", "5b1f", s->json).ok());
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(cdi)) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_THAT(names, ElementsAre("dpproxy-gpu.vendor.com-5b1f.json"));
  ASSERT_TRUE(RemoveClaimCdiSpec(cdi, "gpu.vendor.com", "5b1f").ok());
  EXPECT_FALSE(PathExists(path));
  // Unprepare may come again, and after a reboot the directory may be gone.
  EXPECT_TRUE(RemoveClaimCdiSpec(cdi, "gpu.vendor.com", "5b1f").ok());
  EXPECT_TRUE(RemoveClaimCdiSpec(dir.Sub("absent"), "gpu.vendor.com", "5b1f").ok());
}

}  // namespace
}  // namespace dpproxy
