"""Build macros shared by every dpproxy package.

dpp_grpc_library runs the system protoc and grpc_cpp_plugin (Debian's
protobuf-compiler and protobuf-compiler-grpc) in a genrule, so no Bazel
proto rules have to be downloaded.
"""

_WARNINGS = ["-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"]

def dpp_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = _WARNINGS + copts, **kwargs)

# In a TSan build (--config=tsan), every binary and test carries the
# annotations that make Debian's Abseil mutexes visible to TSan.
_TSAN_DEPS = select({
    "//tools/sanitizers:tsan": ["//tools/sanitizers:tsan_absl"],
    "//conditions:default": [],
})

def dpp_cc_binary(name, copts = [], deps = [], **kwargs):
    native.cc_binary(name = name, copts = _WARNINGS + copts, deps = deps + _TSAN_DEPS, **kwargs)

def dpp_cc_test(name, copts = [], deps = [], **kwargs):
    native.cc_test(
        name = name,
        copts = _WARNINGS + copts,
        deps = deps + ["//third_party:gtest_main", "//third_party:gmock"] + _TSAN_DEPS,
        **kwargs
    )

def dpp_grpc_library(name, src, deps = [], grpc = True, visibility = None):
    """C++ message and service code (plus gMock stubs) for one .proto file.

    Args:
      name: the cc_library target.
      src: the .proto file, in this package.
      deps: dpp_grpc_library targets whose .proto files `src` imports.
      grpc: whether the file defines services.
      visibility: passed to the cc_library.
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc", base + "_mock.grpc.pb.h"]
    dep_protos = [d + "_proto_srcs" for d in deps]
    native.filegroup(
        name = name + "_proto_srcs",
        srcs = [src] + dep_protos,
        visibility = ["//visibility:public"],
    )
    grpc_args = ""
    if grpc:
        grpc_args = ("--grpc_out=generate_mock_code=true:$(GENDIR) " +
                     "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin ")
    native.genrule(
        name = name + "_gen",
        srcs = [src] + dep_protos,
        outs = outs,
        cmd = ("/usr/bin/protoc -I. --cpp_out=$(GENDIR) " + grpc_args +
               "$(location " + src + ")"),
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["//third_party:grpc"],
        visibility = visibility,
    )

def dpp_fuzz_target(name, srcs, deps = [], corpus = None):
    """A libFuzzer target and a test that replays its seed corpus.

    `srcs` define LLVMFuzzerTestOneInput. Two targets:
      <name>_fuzzer       the fuzzer (clang, -fsanitize=fuzzer); manual, built
                          by `tools/dev fuzz` with --config=asan, whose
                          libraries carry libFuzzer's coverage hooks.
      <name>_corpus_test  every file of `corpus` through the same function,
                          with the normal compiler, in every `bazel test //...`.

    Args:
      name: base name.
      srcs: the fuzz target's sources.
      deps: libraries they use.
      corpus: a filegroup of seed inputs.
    """
    native.cc_binary(
        name = name + "_fuzzer",
        srcs = srcs,
        copts = _WARNINGS + ["-fsanitize=fuzzer"],
        linkopts = ["-fsanitize=fuzzer"],
        deps = deps,
        tags = ["manual"],
    )
    native.cc_test(
        name = name + "_corpus_test",
        srcs = srcs,
        copts = _WARNINGS,
        data = [corpus] if corpus else [],
        args = ["$(locations " + corpus + ")"] if corpus else [],
        deps = deps + ["//tests/fuzz:corpus_main"],
    )
