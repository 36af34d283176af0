#!/usr/bin/env python3
"""Writes the seed corpora under tests/fuzz/corpus/ (run from the repo root).

The binary seeds are encoded here by hand from the formats in
proxy/state/state_store.h and proxy/state/journal_file.h, so the corpus
does not depend on a build. Re-run after a format change. Files named crash-* are inputs a fuzzer once
crashed on, kept as regressions; this script leaves them alone.
"""
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def fnv64(data: bytes) -> int:
    h = 14695981039346656037
    for b in data:
        h ^= b
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def varint(n: int) -> bytes:
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num: int, wire: int, payload) -> bytes:
    key = varint((num << 3) | wire)
    if wire == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def allocation(aid: int, resource: str, devices, pod: str = "") -> bytes:
    out = field(1, 0, aid) + field(2, 2, resource.encode())
    for d in devices:
        out += field(3, 2, d.encode())
    out += field(5, 2, b"v1beta1") + field(7, 0, 1700000000000)
    if pod:
        out += field(8, 2, b"default") + field(9, 2, pod.encode()) + field(10, 2, b"main")
    return out


def state_file(payload: bytes) -> bytes:
    return (b"DPPSTATE" + struct.pack("<I", 1) + struct.pack("<Q", len(payload)) +
            struct.pack("<Q", fnv64(payload)) + payload)


def record(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + struct.pack("<Q", fnv64(payload)) + payload


def write(kind: str, name: str, data) -> None:
    os.makedirs(os.path.join(ROOT, kind), exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(os.path.join(ROOT, kind, name), mode) as f:
        f.write(data)


a1 = allocation(1, "vendor.com/gpu", ["gpu-0", "gpu-1"], "train")
a2 = allocation(2, "vendor.com/gpu", ["gpu-2"])
resource = field(1, 2, b"vendor.com/gpu") + field(2, 2, b"v1beta1")
state = field(1, 2, resource) + field(2, 2, a1) + field(2, 2, a2) + field(3, 0, 2)
write("state_file", "empty", state_file(b""))
write("state_file", "two_allocations", state_file(state))
write("state_file", "bad_checksum", state_file(state)[:-1] + b"X")
# A payload alone: the fuzzer also reads its input as one, under a good
# checksum, and decodes it both ways.
write("state_file", "payload_two_allocations", state)
write("journal", "empty", b"DPPJRNL1")
write("journal", "two_records", b"DPPJRNL1" + record(a1) + record(a2))
write("journal", "torn_tail", b"DPPJRNL1" + record(a1) + record(a2)[:9])
write("journal", "space_ahead", b"DPPJRNL1" + record(a1) + bytes(64))
write("journal", "torn_in_space_ahead", b"DPPJRNL1" + record(a1) + record(a2)[:9] + bytes(64))
damaged = bytearray(b"DPPJRNL1" + record(a1) + record(a2) + record(a1))
damaged[30] ^= 0x20
write("journal", "damaged_middle", bytes(damaged))

write("translate", "container_response",
      field(1, 2, field(1, 2, b"GPU") + field(2, 2, b"gpu-0")) +
      field(4, 2, field(1, 2, b"a") + field(2, 2, b"b")))
write("translate", "device_list",
      field(1, 2, field(1, 2, b"gpu-0") + field(2, 2, b"Healthy")) +
      field(1, 2, field(1, 2, b"gpu-1") + field(2, 2, b"Unhealthy")))
# Device lists as plugins send them: with topology, an empty topology, a
# topology in two parts, unknown fields at both levels, a repeated ID.
numa0 = field(1, 2, field(1, 0, 0))
numa1 = field(1, 2, field(1, 0, 1))
write("device_list", "plain",
      field(1, 2, field(1, 2, b"gpu-0") + field(2, 2, b"Healthy")) +
      field(1, 2, field(1, 2, b"gpu-1") + field(2, 2, b"Unhealthy")))
write("device_list", "topology",
      field(1, 2, field(1, 2, b"gpu-0") + field(2, 2, b"Healthy") + field(3, 2, numa0)) +
      field(1, 2, field(1, 2, b"gpu-1") + field(2, 2, b"Healthy") + field(3, 2, b"")) +
      field(1, 2, field(1, 2, b"gpu-2") + field(3, 2, numa0) + field(3, 2, numa1)))
write("device_list", "unknown_fields",
      field(7, 0, 5) + field(1, 2, field(9, 2, b"x") + field(1, 2, b"gpu-0") + field(2, 0, 3) +
                            field(2, 2, b"Healthy")) + field(1, 0, 1))
write("device_list", "repeated_id",
      field(1, 2, field(1, 2, b"a") + field(1, 2, b"b")) + field(1, 2, field(1, 2, b"b")))
write("device_list", "cut", field(1, 2, field(1, 2, b"gpu-0"))[:-2])

write("translate", "alpha_request", field(1, 2, b"gpu-0") + field(1, 2, b"gpu-1"))

for i, s in enumerate(["vendor.com/gpu", "kubernetes.io/gpu", "requests.x/y", "a" * 300,
                       "../../etc/passwd", "gpu\x00.sock", "kubelet.sock", "v1beta1",
                       "v1alpha2", "dev\nid", ""]):
    write("kubelet_rules", f"s{i}", s.encode("utf-8", "surrogateescape"))

with open(os.path.join(os.path.dirname(ROOT), "..", "..", "tools", "conform",
                       "sample_plugin.expect")) as f:
    write("expect", "sample_plugin.expect", f.read())
write("expect", "docs_example.expect",
      "# SCENARIO  RELEASES   OUTCOME  REASON\n"
      "registers   1.9        FAIL     v1beta1 only\n"
      "serves-first 1.25-1.37 FAIL     registers before serving\n"
      "allocate    1.9-1.27,1.28 FAIL  CDI only\n"
      "kubelet-restart real:1.37 blocked  by hand\n"
      "health real FAIL any real kubelet\n")
write("expect", "bad_lines.expect",
      "registers 1.37-1.9 FAIL reversed\nnope all FAIL x\nallocate 1.99 FAIL y\n"
      "allocate all PASS z\nallocate all FAIL\tok\x01\n")

write("config", "minimal.yaml", "kubelet:\n  root: /var/lib/kubelet\nplugin_dir: /var/lib/dpproxy/device-plugins\n")
write("config", "renames.yaml", "renames:\n  legacy.com/gpu: vendor.com/gpu\nid_maps:\n  vendor.com/gpu:\n    GPU-abc: gpu-0\n")
write("config", "bad.yaml", "timeouts: {backend: 5s\n")
write("config", "dra.yaml", "kubelet: {api: dra}\ndra:\n  driver: gpu.vendor.com\n  node_name: node-1\n  kubeconfig: /etc/dpproxy/kubeconfig\n  cdi_dir: /var/run/cdi\n")
write("config", "static.yaml", "static_backends:\n  - resource: vendor.com/gpu\n    endpoint: /run/x.sock\n    api: v1alpha\n")

write("kubelet_checkpoint", "v19.json",
      '{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"main","ResourceName":"vendor.com/gpu",'
      '"DeviceIDs":["gpu-0"],"AllocResp":"Cg=="}],"RegisteredDevices":{"vendor.com/gpu":["gpu-0"]}}')
write("kubelet_checkpoint", "v111.json",
      '{"Data":{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"main","ResourceName":'
      '"vendor.com/gpu","DeviceIDs":["gpu-0"],"AllocResp":"Cg=="}],"RegisteredDevices":{}},'
      '"Checksum":1}')
write("kubelet_checkpoint", "v120.json",
      '{"Data":{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"main","ResourceName":'
      '"vendor.com/gpu","DeviceIDs":{"-1":["gpu-0"],"0":["gpu-1"]},"AllocResp":"Cg=="}],'
      '"RegisteredDevices":{"vendor.com/gpu":["gpu-0","gpu-1"]}},"Checksum":2}')
write("kubelet_checkpoint", "null_entries.json",
      '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":3}')

# API-server answers in DRA mode (kube_answer): sane ones, and the shapes
# that once ended dpproxy (a number for a string, an array for an object).
write("kube_answer", "group.json",
      '{"kind":"APIGroup","name":"resource.k8s.io","versions":[{"groupVersion":'
      '"resource.k8s.io/v1","version":"v1"},{"version":"v1beta1"}]}')
write("kube_answer", "group_number.json", '{"versions":[{"version":1}]}')
write("kube_answer", "slices.json",
      '{"items":[{"metadata":{"name":"node-1-gpu-0","resourceVersion":"7"},"spec":{'
      '"driver":"gpu.vendor.com","nodeName":"node-1","pool":{"name":"node-1/vendor.com-gpu",'
      '"generation":3,"resourceSliceCount":1},"devices":[{"name":"gpu-0","attributes":'
      '{"index":{"int":0}}},{"name":"gpu-1","basic":{"attributes":{}}}]}}]}')
write("kube_answer", "slices_nulls.json",
      '{"items":[null,{"metadata":null,"spec":{"pool":{"name":null,"generation":1e300}}}]}')
write("kube_answer", "claim.json",
      '{"metadata":{"name":"train","namespace":"default","uid":'
      '"0badc0de-0000-4000-8000-000000000001"},"status":{"allocation":{"devices":{"results":'
      '[{"request":"gpu","driver":"gpu.vendor.com","pool":"node-1/vendor.com-gpu","device":'
      '"gpu-0"}]}}}}')
write("kube_answer", "claim_arrays.json", '{"status":{"allocation":{"devices":[]}}}')
write("kube_answer", "uid_climb", "../../../../tmp/x/victim")
# Nested past any sane object: just past the limit, and deep enough that a
# walk recursing on depth runs out of stack (both refused before parsing).
write("kube_answer", "deep_65.json", '{"items":' + "[" * 64 + "]" * 64 + "}")
write("kube_answer", "deep_60000.json", '{"a":' * 60000 + "1" + "}" * 60000)
write("kubelet_checkpoint", "deep_60000.json", '{"Data":' + "[" * 60000 + "]" * 60000 + "}")
