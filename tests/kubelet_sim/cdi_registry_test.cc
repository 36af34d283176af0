// The kubelet sim's CDI resolution, as a container runtime resolves the
// names a DRA driver returns: found in a spec of the right kind, edits of
// the spec and of the device applied, and every name that cannot be used
// (undefined, defined twice, unqualified) an error naming it.
#include "tools/kubelet_sim/cdi_registry.h"

#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Json = nlohmann::json;

TEST(CdiRegistryTest, NamesResolveToTheEditsOfTheirSpecAndDevice) {
  testing::ShortTempDir dir;
  const std::string etc = dir.Sub("etc-cdi"), run = dir.Sub("run-cdi");
  ASSERT_TRUE(MakeDirs(etc).ok());
  ASSERT_TRUE(MakeDirs(run).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(run, "claim.json"), R"({
    "cdiVersion": "0.6.0", "kind": "gpu.vendor.com/claim",
    "containerEdits": {"env": ["DRIVER=gpu"]},
    "devices": [
      {"name": "u1-gpu", "containerEdits": {"env": ["GPUS=0,1"],
        "deviceNodes": [{"path": "/dev/gpu0", "hostPath": "/dev/gpu0", "permissions": "rw"}]}},
      {"name": "u2-gpu", "containerEdits": {"env": ["GPUS=2"]}}]})")
                  .ok());
  // A vendor's own spec, in YAML as nvidia-ctk writes them.
  ASSERT_TRUE(WriteFileAtomic(JoinPath(etc, "vendor.yaml"), R"(cdiVersion: "0.6.0"
kind: vendor.com/gpu
devices:
  - name: gpu-0
    containerEdits:
      mounts:
        - {hostPath: /usr/lib/libgpu.so, containerPath: /usr/lib/libgpu.so, options: [ro, bind]}
)")
                  .ok());
  const CdiResolution r =
      ResolveCdiDevices({etc, run}, {"gpu.vendor.com/claim=u1-gpu", "vendor.com/gpu=gpu-0"});
  EXPECT_THAT(r.errors, IsEmpty());
  EXPECT_THAT(r.warnings, IsEmpty());
  EXPECT_EQ(r.edits["env"], Json({"DRIVER=gpu", "GPUS=0,1"}));
  ASSERT_EQ(r.edits["deviceNodes"].size(), 1u);
  EXPECT_EQ(r.edits["deviceNodes"][0]["path"], "/dev/gpu0");
  ASSERT_EQ(r.edits["mounts"].size(), 1u);
  EXPECT_EQ(r.edits["mounts"][0]["options"], Json({"ro", "bind"}));
  // Specs are read at each call: a removed spec no longer resolves.
  ASSERT_EQ(::unlink(JoinPath(run, "claim.json").c_str()), 0);
  const CdiResolution gone = ResolveCdiDevices({etc, run}, {"gpu.vendor.com/claim=u1-gpu"});
  EXPECT_THAT(gone.errors,
              ElementsAre(HasSubstr("unresolvable CDI device gpu.vendor.com/claim=u1-gpu")));
  EXPECT_EQ(gone.edits["env"], Json::array());
}

TEST(CdiRegistryTest, WhatARuntimeRefusesIsAnErrorNamingTheName) {
  testing::ShortTempDir dir;
  const std::string run = dir.Sub("cdi");
  ASSERT_TRUE(MakeDirs(run).ok());
  const std::string spec =
      R"({"cdiVersion": "0.6.0", "kind": "a.com/x", "devices": [{"name": "d0"}]})";
  ASSERT_TRUE(WriteFileAtomic(JoinPath(run, "one.json"), spec).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(run, "two.json"), spec).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(run, "broken.json"), "{").ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(run, "notes.txt"), "not a spec").ok());
  const CdiResolution r = ResolveCdiDevices({run, dir.Sub("absent")},
                                            {"a.com/x=d0", "d0", "a.com/x=d9", "b.com/y=d0"});
  EXPECT_THAT(r.errors,
              ElementsAre(AllOf(HasSubstr("a.com/x=d0 is defined more than once"),
                                HasSubstr("one.json"), HasSubstr("two.json")),
                          HasSubstr("\"d0\" is not a qualified CDI device name"),
                          HasSubstr("unresolvable CDI device a.com/x=d9"),
                          HasSubstr("no spec of kind b.com/y")));
  EXPECT_THAT(r.warnings, ElementsAre(HasSubstr("broken.json: not JSON")));
}

}  // namespace
}  // namespace dpproxy::sim
