#!/usr/bin/env python3
"""dpproxy on a real Kubernetes node (tools/realnode): scenarios that assert.

    e2e.py --release=1.37 --dpproxy=PATH --sample_plugin=PATH --logs=DIR [--scenarios=a,b]

Brings a real node up (tools/realnode/realnode.py), runs each scenario with
the given dpproxy binary (the shipped one) and sample_plugin as the vendor
plugin, and prints one line per scenario: "PASSED <release> <name>" or
"FAILED <release> <name>: <why>", or "N/A <release> <name>: <why>" for
one the release cannot have (DRA mode before 1.32). A failed scenario keeps the kubelet's,
containerd's, dpproxy's and the plugins' logs under DIR/<release>/<name>/.
The node is torn down at the end whatever happened. Exit status 0 only if
every scenario passed; a node that cannot come up fails every scenario,
naming the part.
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import re
import tempfile
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "realnode"))
import realnode  # noqa: E402

# Each scenario serves a resource of its own (example.com/gpu<N>): the node's
# status, updated every 10 s, may still show the one before's devices.
RESOURCE_PREFIX = "example.com/gpu"
DEVICES = 4
CDI_DIR = "/var/run/cdi"


class Failure(Exception):
    pass


class NotApplicable(Exception):
    """The node cannot have what the scenario needs (printed N/A, counted
    as neither passed nor failed)."""


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def wait_until(what, fn, timeout=60):
    """Polls fn() until it returns a true value, which it returns; fails
    naming `what` and the last value seen at the deadline. Logs how long
    each wait took to stderr."""
    start = time.monotonic()
    deadline = start + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except realnode.NodeError as e:
            last = e
        if last and not isinstance(last, Exception):
            print("e2e: %.1f s: %s" % (time.monotonic() - start, what), file=sys.stderr,
                  flush=True)
            return last
        time.sleep(0.2)
    raise Failure("%s: not after %d s (last: %r)" % (what, timeout, last))


def pod_manifest(name, script, resources):
    """A host-network pod in namespace default of one busybox container
    "c" running `script`, with `resources` (limits or claims)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "hostNetwork": True, "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "c", "image": realnode.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script], "resources": resources}],
        },
    }


def container_log(pod, container, streams=("stdout", "stderr")):
    """What a pod's container wrote to `streams`, read from the kubelet's
    log files (every restart of it, oldest first)."""
    meta = pod["metadata"]
    d = "/var/log/pods/%s_%s_%s/%s" % (meta["namespace"], meta["name"], meta["uid"], container)
    text = ""
    if os.path.isdir(d):
        for f in sorted(os.listdir(d)):
            with open(os.path.join(d, f), errors="replace") as fh:
                for line in fh:
                    # CRI log lines: TIME STREAM TAG TEXT
                    parts = line.rstrip("\n").split(" ", 3)
                    if len(parts) == 4 and parts[1] in streams:
                        text += parts[3] + "\n"
    return text


class Proc:
    """A process of the scenario's (dpproxy or a plugin), logged to a file."""

    def __init__(self, name, args, logdir, env=None):
        self.name, self.args = name, args
        self.log = os.path.join(logdir, name + ".log")
        self.env = dict(os.environ, **env) if env else None
        self.p = None

    def start(self):
        with open(self.log, "ab") as out:
            self.p = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True, env=self.env)
        return self

    def output(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def kill(self, sig=signal.SIGTERM, timeout=20):
        if self.p is None or self.p.poll() is not None:
            return
        self.p.send_signal(sig)
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()

    def alive(self):
        return self.p is not None and self.p.poll() is None


class Scenario:
    """What each scenario gets: the node, a work directory, a resource name
    of its own, and helpers to run dpproxy and the sample plugin and to make
    pods."""

    count = 0

    def __init__(self, node, args, name):
        self.node, self.args, self.name = node, args, name
        self.work = tempfile.mkdtemp(prefix="dpproxy-e2e-%s." % name)
        self.procs = []
        self.pods = []
        self.host_paths = []
        self.minor = realnode.minor_of(node.release)
        Scenario.count += 1
        self.resource = "%s%d" % (RESOURCE_PREFIX, Scenario.count)
        self.manifests = []
        # Called first at the end, newest first (a Helm release to uninstall).
        self.at_end = []

    # -- processes

    def dpproxy(self, *extra, name="dpproxy", env=None):
        state = os.path.join(self.work, "state")
        args = [self.args.dpproxy, "--kubelet_root=" + realnode.KUBELET_ROOT,
                "--plugin_dir=" + self.plugin_dir(), "--state_dir=" + state,
                "--status_file=" + os.path.join(self.work, "status.json"),
                "--events=" + os.path.join(self.work, "events.jsonl"),
                "--metrics_address=", "--container_runtime_endpoint="
                + realnode.CONTAINERD_SOCKET] + list(extra)
        p = Proc(name, args, self.work, env).start()
        self.procs.append(p)
        return p

    def plugin_dir(self):
        return os.path.join(self.work, "device-plugins")

    def plugin(self, api, *extra, name="plugin", resource=None, devices=DEVICES,
               kubelet_socket=None):
        """The sample plugin serving `resource` (devices <name>-0...), through
        dpproxy unless kubelet_socket names the kubelet's own."""
        resource = resource or self.resource
        short = resource.split("/")[1]
        self.device_nodes(short, devices)
        if api == "v1beta1":
            # Its answers name CDI devices: the spec behind them, or the
            # runtime refuses to create the container.
            extra = ("--cdi_dir=" + CDI_DIR,) + extra
            self.host_paths.append("%s/sample-plugin-%s.json" % (CDI_DIR, resource.replace("/", "-")))
        args = [self.args.sample_plugin, "--api=" + api, "--resource=" + resource,
                "--devices=%d" % devices, "--id_pattern=%s-{i}" % short,
                "--kubelet_socket=" + (kubelet_socket or
                                       os.path.join(self.plugin_dir(), "kubelet.sock")),
                "--socket_name=sample-%s-%s.sock" % (short, name),
                "--quiet"] + list(extra)
        p = Proc(name, args, self.work).start()
        self.procs.append(p)
        return p

    def device_nodes(self, short, devices, prefix=None):
        """The host paths the sample plugin's answers name: a file per
        device to mount, and device nodes (copies of /dev/null's numbers),
        as a real driver would have made them. Device IDs are
        <prefix>-<i> (prefix: short)."""
        for i in range(devices):
            dev_id = "%s-%d" % (prefix or short, i)
            f = "/run/sample-plugin/%s/%s" % (short, dev_id)
            os.makedirs(os.path.dirname(f), exist_ok=True)
            with open(f, "w") as out:
                out.write("device %s\n" % dev_id)
            for d in ("/dev/sample/", "/dev/sample-cdi/"):
                os.makedirs(d, exist_ok=True)
                if not os.path.exists(d + dev_id):
                    os.mknod(d + dev_id, 0o666 | 0o020000, os.makedev(1, 3))
        for p in ("/run/sample-plugin", "/dev/sample", "/dev/sample-cdi"):
            if p not in self.host_paths:
                self.host_paths.append(p)

    # -- the node's view

    def allocatable(self, resource=None):
        node = self.node.get_json("node", realnode.NODE_NAME)
        return int(node["status"].get("allocatable", {}).get(resource or self.resource, "0"))

    def wait_allocatable(self, n, timeout=60, resource=None):
        resource = resource or self.resource
        wait_until("the node's allocatable %s == %d" % (resource, n),
                   lambda: self.allocatable(resource) == n or None, timeout)

    def pod(self, name, count, script="sleep 3600", resource=None, tolerate=True):
        """Creates a host-network pod of one busybox container asking for
        `count` devices; returns its name. `tolerate`: it tolerates every
        taint (a kubelet restart's not-ready ones); without, it is an
        ordinary workload's pod."""
        manifest = pod_manifest(name, script,
                                {"limits": {resource or self.resource: str(count)}})
        if not tolerate:
            del manifest["spec"]["tolerations"]
        self.node.kubectl("apply", "-f", "-", input=json.dumps(manifest).encode())
        self.pods.append(name)
        return name

    def apply(self, path):
        """Applies a manifest file; its objects are deleted at the end."""
        self.node.kubectl("apply", "-f", path)
        self.manifests.append(path)

    def apply_json(self, obj):
        path = os.path.join(self.work, "object-%d.json" % len(self.manifests))
        with open(path, "w") as f:
            json.dump(obj, f)
        self.apply(path)

    def pod_json(self, name):
        return self.node.get_json("pod", name, "-n", "default")

    def wait_running(self, name, timeout=90):
        def running():
            p = self.pod_json(name)
            phase = p["status"].get("phase")
            if phase == "Failed":
                raise Failure("pod %s failed: %s" % (name, p["status"].get("message") or
                                                     p["status"].get("reason")))
            return p if phase == "Running" else None
        return wait_until("pod %s Running" % name, running, timeout)

    def container_id(self, name):
        st = self.pod_json(name)["status"].get("containerStatuses", [])
        return st[0].get("containerID") if st else None

    def log_of(self, name):
        """The container's standard output, read from the kubelet's log
        files."""
        return container_log(self.pod_json(name), "c", ("stdout",))

    def wait_log(self, name, needle, timeout=30):
        return wait_until("%r in pod %s's output" % (needle, name),
                          lambda: needle in self.log_of(name) and self.log_of(name), timeout)

    def devices_of(self, name, resource=None):
        """The device IDs the container's environment names (the plugin's
        Allocate answer, as the runtime applied it)."""
        var = "SAMPLE_%s_DEVICES=" % (resource or self.resource).split("/")[1].upper()
        for line in self.log_of(name).splitlines():
            if line.startswith(var):
                return sorted(line.split("=", 1)[1].split(","))
        return []

    # -- end

    def finish(self, failed, logs):
        for fn in reversed(self.at_end):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - the rest of the clean-up still runs
                print("e2e: %s: clean-up: %s" % (self.name, e), file=sys.stderr)
        if failed:
            dest = os.path.join(logs, self.node.release, self.name)
            os.makedirs(dest, exist_ok=True)
            for f in os.listdir(self.work):
                src = os.path.join(self.work, f)
                if os.path.isfile(src):
                    shutil.copy(src, dest)
            for f in ("kubelet.log", "containerd.log", "kube-apiserver.log",
                      "kube-scheduler.log"):
                src = os.path.join(self.node.logs, f)
                if os.path.exists(src):
                    shutil.copy(src, dest)
            for pod in self.pods:
                try:
                    with open(os.path.join(dest, "pod-%s.json" % pod), "w") as out:
                        out.write(self.node.kubectl("get", "pod", pod, "-o", "json",
                                                    check=False))
                except Exception:  # noqa: BLE001 - best effort on a failing node
                    pass
        for pod in self.pods:
            self.node.kubectl("delete", "pod", pod, "--grace-period=0", "--force",
                              "--wait=false", check=False)
        if self.pods:
            try:
                wait_until("the scenario's pods gone", lambda: not json.loads(
                    self.node.kubectl("get", "pods", "-o", "json"))["items"], 60)
            except Failure as e:
                print("e2e: %s: %s" % (self.name, e), file=sys.stderr)
        for path in reversed(self.manifests):
            self.node.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", path,
                              check=False)
        for p in reversed(self.procs):
            p.kill()
        # dpproxy leaves its slices published when it stops (docs/dra.md).
        self.node.kubectl("delete", "resourceslices", "--field-selector",
                          "spec.driver=" + DRIVER, "--wait=false", check=False)
        # A dpproxy started by another (SIGUSR2) is no child of ours.
        for pid in realnode.pids_of_exe(self.args.dpproxy):
            realnode.kill_and_wait(pid, signal.SIGTERM, 20)
        for path in self.host_paths:
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.lexists(path):
                os.remove(path)
        shutil.rmtree(self.work, ignore_errors=True)


SCRIPT = ("env | grep ^SAMPLE_; echo '== dev'; ls /dev/sample; echo '== mounts'; "
          "cat /run/sample/*; echo '== cdi'; ls /dev/sample-cdi; echo READY; sleep 3600")


def sections(text):
    """The container's output by section of SCRIPT: env, dev, mounts, cdi."""
    out, cur = {"env": []}, "env"
    for line in text.splitlines():
        if line.startswith("== "):
            cur = line[3:]
            out[cur] = []
        elif line != "READY":
            out[cur].append(line)
    return out


def check_inside(s, pod, api, count, cdi=False):
    """The plugin's answer, seen from inside the running container: its env,
    a mount and a device node per device, and (cdi) the device nodes of the
    CDI devices it named, which containerd resolved."""
    text = s.wait_log(pod, "READY")
    devs = s.devices_of(pod)
    got = sections(text)
    check(len(devs) == count, "%s: the container's SAMPLE_<resource>_DEVICES names %d devices, "
          "not %d:\n%s" % (pod, len(devs), count, text))
    check("SAMPLE_PLUGIN_API=%s" % api in got["env"], "%s: the plugin's env var "
          "SAMPLE_PLUGIN_API=%s is not in the container:\n%s" % (pod, api, text))
    check(sorted(got.get("mounts", [])) == ["device %s" % d for d in devs],
          "%s: the container's mounts under /run/sample are not those of %s:\n%s"
          % (pod, devs, text))
    check(sorted(got.get("dev", [])) == devs, "%s: the device nodes under /dev/sample are "
          "not those of %s:\n%s" % (pod, devs, text))
    if cdi:
        # The kubelet reads the answer's cdi_devices from 1.29 on (beta,
        # on by default; GA in 1.31); before, it drops them.
        want = devs if s.minor >= 29 else []
        check(sorted(got.get("cdi", [])) == want, "%s: the CDI devices' nodes under "
              "/dev/sample-cdi are not %s on Kubernetes %s:\n%s"
              % (pod, want, s.node.release, text))
    return devs


def first_pod(s, api="v1beta1", count=2, proxy_flags=(), plugin_flags=(), cdi=False):
    """dpproxy, the sample plugin of `api` behind it, and pod p1 of `count`
    devices running with them (checked from inside); returns dpproxy and
    the plugin."""
    proxy = s.dpproxy(*proxy_flags)
    plugin = s.plugin(api, *plugin_flags)
    s.wait_allocatable(DEVICES)
    s.pod("p1", count, SCRIPT)
    s.wait_running("p1")
    check_inside(s, "p1", api, count, cdi=cdi)
    return proxy, plugin


def scenario_registration_kubelet_sock(s):
    """A v1beta1 plugin behind dpproxy registered through kubelet.sock: the
    node shows its devices and a pod gets them, CDI devices included."""
    first_pod(s, cdi=True)


def scenario_registration_plugin_watcher(s):
    """dpproxy registered through the kubelet's plugin watcher."""
    first_pod(s, count=1, proxy_flags=("--kubelet_registration=plugin-watcher",))


def scenario_v1alpha_plugin(s):
    """A v1alpha plugin (Kubernetes 1.9's API) behind dpproxy on this
    release: its env, mounts and device nodes inside the container."""
    first_pod(s, api="v1alpha")


def _two_pods_disjoint(s, a, b):
    da, db = set(s.devices_of(a)), set(s.devices_of(b))
    check(not (da & db), "device used twice: %s has %s, %s has %s" % (a, sorted(da), b,
                                                                      sorted(db)))


def scenario_kubelet_restart(s):
    """The kubelet restarts: the running pod keeps its container, dpproxy
    registers again, and the next pod gets other devices."""
    first_pod(s)
    before = s.container_id("p1")
    s.node.restart_kubelet()
    s.wait_allocatable(DEVICES, 90)
    s.pod("p2", 2, SCRIPT)
    s.wait_running("p2")
    check_inside(s, "p2", "v1beta1", 2)
    p1 = s.pod_json("p1")
    check(p1["status"]["phase"] == "Running" and s.container_id("p1") == before,
          "p1 did not keep its container through the kubelet restart: %s" %
          json.dumps(p1["status"], indent=1))
    _two_pods_disjoint(s, "p1", "p2")


def scenario_plugin_restart(s):
    """The vendor plugin restarts behind dpproxy: the running pod stays, the
    next pod is admitted."""
    _, plugin = first_pod(s, count=1)
    plugin.kill()
    s.plugin("v1beta1", name="plugin2")
    s.wait_allocatable(DEVICES)
    s.pod("p2", 1, SCRIPT)
    s.wait_running("p2")
    check_inside(s, "p2", "v1beta1", 1)
    check(s.pod_json("p1")["status"]["phase"] == "Running", "p1 stopped running")
    _two_pods_disjoint(s, "p1", "p2")


def scenario_dpproxy_sigkill(s, restart_signal):
    """dpproxy is killed with SIGKILL and started again: nothing it answered
    is lost, the plugin is connected again (whether it watches only its own
    socket or only kubelet.sock), and no device is used twice."""
    proxy, _ = first_pod(s, plugin_flags=("--restart_signal=" + restart_signal,))
    proxy.kill(signal.SIGKILL)
    s.dpproxy(name="dpproxy2")
    s.wait_allocatable(DEVICES, 60)
    s.pod("p2", 2, SCRIPT)
    s.wait_running("p2")
    check_inside(s, "p2", "v1beta1", 2)
    check(s.pod_json("p1")["status"]["phase"] == "Running", "p1 stopped running")
    _two_pods_disjoint(s, "p1", "p2")


def scenario_plugin_options_change(s):
    """The vendor plugin is replaced by one whose options differ (it asks
    for PreStartContainer now). A 1.25+ kubelet keeps the options it read
    when it dialled, and a 1.37 one refuses a registration at a socket it
    still streams from ("device plugin already connected"), then keeps
    that socket for good: dpproxy registers nothing again and serves the
    difference itself. The running pod keeps its devices, the next pod
    runs, the kubelet refused nothing, and a stop of dpproxy still takes
    the devices off the node."""
    proxy, _ = first_pod(s, count=1)
    before = s.container_id("p1")
    offset = os.path.getsize(os.path.join(s.node.logs, "kubelet.log"))
    ups = len(_events(s, "backend_up"))
    s.procs[-1].kill()
    s.plugin("v1beta1", "--pre_start_required", name="plugin2")
    wait_until("dpproxy serving the new plugin",
               lambda: len(_events(s, "backend_up")) > ups, 60)
    s.pod("p2", 1, SCRIPT)
    s.wait_running("p2", 90)
    check(_running_with(s, "p1", before), "p1 did not keep its container")
    _two_pods_disjoint(s, "p1", "p2")
    s.wait_allocatable(DEVICES, 30)
    proxy.kill(signal.SIGTERM)
    s.wait_allocatable(0, 60)
    refused = [line for line in _kubelet_log_from(s.node, offset).splitlines()
               if "already connected" in line]
    check(not refused, "the kubelet refused a registration:\n%s" % "\n".join(refused[:5]))


def scenario_restarts_after_takeover(s):
    """A --takeover, then plain stops and starts of dpproxy and another
    takeover, a pod after each: the kubelet must never keep a dpproxy
    that has gone as the resource's endpoint, nor refuse a registration.
    A 1.37 kubelet tracks a resource's clients per socket, and refuses a
    registration at a socket it still streams from ("device plugin
    already connected"), after which it no longer disconnects that
    socket's client when its stream ends."""
    proxy, _ = first_pod(s, count=1)
    offset = os.path.getsize(os.path.join(s.node.logs, "kubelet.log"))

    def takeover(old, name):
        new = s.dpproxy("--takeover", name=name)
        wait_until("%s handing over" % old.name, lambda: not old.alive(), 60)
        check(old.p.returncode == 0, "%s exited with %d" % (old.name, old.p.returncode))
        return new

    def stop(p):
        p.kill(signal.SIGTERM)
        check(p.p.returncode == 0, "%s exited with %d" % (p.name, p.p.returncode))

    b = takeover(proxy, "dpproxy-b")
    s.pod("p2", 1, SCRIPT)
    s.wait_running("p2")
    stop(b)
    c = s.dpproxy(name="dpproxy-c")
    s.pod("p3", 1, SCRIPT)
    s.wait_running("p3", 90)
    d = takeover(c, "dpproxy-d")
    s.pod("p4", 1, SCRIPT)
    s.wait_running("p4", 90)
    stop(d)
    s.dpproxy(name="dpproxy-e")
    s.node.kubectl("delete", "pod", "p2", "--wait=true", "--timeout=60s")
    s.pod("p5", 1, SCRIPT)
    s.wait_running("p5", 90)
    refused = [line for line in _kubelet_log_from(s.node, offset).splitlines()
               if "already connected" in line]
    check(not refused, "the kubelet refused a registration:\n%s" % "\n".join(refused[:5]))
    live = ["p1", "p3", "p4", "p5"]
    for i, a in enumerate(live):
        for b2 in live[i + 1:]:
            _two_pods_disjoint(s, a, b2)


def scenario_takeover_new_dies_registered(s):
    """A --takeover whose new dpproxy is killed (SIGKILL) once it has
    registered with the kubelet, before the old one is told to finish (it
    stops there: DPPROXY_TEST_PAUSE_AT=registered). The old one takes the
    state back, ends its stream to the kubelet and registers the resource
    again once the kubelet has let it go (kubelet_endpoint_reclaimed): a
    1.25-1.36 kubelet dropped the resource by name when the new one died,
    yet kept taking the old stream's device lists (its devices Healthy,
    every Allocate failing on the stopped endpoint). No registration is
    refused (a 1.37 kubelet refuses one at a socket it streams from), the
    running pod keeps its container, and the next pod runs on another
    device."""
    proxy, _ = first_pod(s, count=1)
    container = s.container_id("p1")
    offset = os.path.getsize(os.path.join(s.node.logs, "kubelet.log"))
    new = s.dpproxy("--takeover", name="dpproxy-dies", env={"DPPROXY_TEST_PAUSE_AT": "registered"})
    wait_until("the new dpproxy registered (and stopped there)",
               lambda: "PAUSE_AT=registered" in new.output(), 60)
    new.kill(signal.SIGKILL)
    wait_until("the old dpproxy took the state back",
               lambda: len(_events(s, "handoff_taken_back")) > 0, 30)
    wait_until("the old dpproxy registering the resource again",
               lambda: len(_events(s, "kubelet_endpoint_reclaimed")) > 0, 30)
    s.pod("p2", 1, SCRIPT)
    s.wait_running("p2", 90)
    check(proxy.alive(), "the old dpproxy exited (%s)" % proxy.p.returncode)
    refused = [line for line in _kubelet_log_from(s.node, offset).splitlines()
               if "already connected" in line]
    check(not refused, "the kubelet refused a registration:\n%s" % "\n".join(refused[:5]))
    check(_running_with(s, "p1", container), "p1 did not keep its container")
    _two_pods_disjoint(s, "p1", "p2")


def _running_with(s, pod, container):
    p = s.pod_json(pod)
    return p["status"].get("phase") == "Running" and s.container_id(pod) == container


def scenario_checkpoint_loss(s):
    """The kubelet restarts without its device checkpoint, beside a plugin
    registered with it directly: no running pod is killed, the next pod gets
    the free device and not one a running pod holds, and once a holder is
    deleted the pod after it is admitted with that holder's devices."""
    s.dpproxy()
    s.plugin("v1beta1")
    s.plugin("v1beta1", name="direct", resource="example.com/direct", devices=2,
             kubelet_socket=os.path.join(realnode.KUBELET_ROOT, "device-plugins",
                                         "kubelet.sock"))
    s.wait_allocatable(DEVICES)
    s.wait_allocatable(2, resource="example.com/direct")
    s.pod("p1", 2, SCRIPT)
    s.pod("p2", 1, SCRIPT)
    s.pod("d1", 1, "env; echo READY; sleep 3600", resource="example.com/direct")
    running = {}
    for pod in ("p1", "p2", "d1"):
        s.wait_running(pod)
        s.wait_log(pod, "READY")
        running[pod] = s.container_id(pod)
    held = set(s.devices_of("p1")) | set(s.devices_of("p2"))
    check(len(held) == 3, "p1 and p2 hold %s, not three devices" % sorted(held))

    checkpoint = os.path.join(realnode.KUBELET_ROOT, "device-plugins",
                              "kubelet_internal_checkpoint")
    s.node.stop_process("kubelet")
    check(os.path.exists(checkpoint), "the kubelet wrote no checkpoint at %s" % checkpoint)
    os.remove(checkpoint)
    s.node.start_kubelet()

    def registered_again():
        with open(checkpoint) as f:
            return s.resource in json.load(f)["Data"].get("RegisteredDevices", {})
    wait_until("the restarted kubelet's checkpoint lists %s" % s.resource,
               lambda: os.path.exists(checkpoint) and registered_again(), 60)
    s.pod("p3", 1, SCRIPT)
    s.wait_running("p3")
    p3 = check_inside(s, "p3", "v1beta1", 1)
    check(not (set(p3) & held), "p3 was given %s, which a running pod holds (%s)"
          % (p3, sorted(held)))
    for pod, container in running.items():
        check(_running_with(s, pod, container), "%s did not keep its container through "
              "the checkpoint loss: %s" % (pod, json.dumps(s.pod_json(pod)["status"])))

    freed = s.devices_of("p1")
    s.node.kubectl("delete", "pod", "p1", "--wait=false")
    s.pod("p4", 2, SCRIPT)
    s.wait_running("p4", 120)
    p4 = check_inside(s, "p4", "v1beta1", 2)
    check(sorted(p4) == sorted(freed), "p4 got %s, not the deleted holder's %s"
          % (p4, freed))
    for a, b in (("p2", "p3"), ("p2", "p4"), ("p3", "p4")):
        _two_pods_disjoint(s, a, b)
    for pod in ("p2", "d1"):
        check(_running_with(s, pod, running[pod]), "%s stopped running" % pod)


def scenario_never_started_container(s):
    """Issue 52.2 on the real node: a pod whose container never starts (its
    image is not there and is never pulled) holds devices when the kubelet
    restarts without its device checkpoint. The kubelet admits it again,
    with new devices; dpproxy must not refuse that as "held by a running
    container" (none of that pod ever ran, the container runtime says so).
    The pod stays waiting for its image, never Failed; the running pod keeps
    its container and devices; and once the waiting pod is deleted its
    devices serve the next pod."""
    s.dpproxy()
    s.plugin("v1beta1")
    s.wait_allocatable(DEVICES)
    s.pod("run", 2, SCRIPT)
    s.wait_running("run")
    s.wait_log("run", "READY")
    container = s.container_id("run")
    held = set(s.devices_of("run"))
    manifest = pod_manifest("waits", "true", {"limits": {s.resource: "2"}})
    manifest["spec"]["containers"][0]["image"] = "dpproxy.invalid/never-pulled:1"
    s.apply_json(manifest)
    s.pods.append("waits")

    def waiting_for_image():
        st = s.pod_json("waits")["status"]
        if st.get("phase") == "Failed":
            raise Failure("waits failed: %s" % json.dumps(st))
        for c in st.get("containerStatuses", []):
            if c.get("state", {}).get("waiting", {}).get("reason") == "ErrImageNeverPull":
                return True
        return None
    wait_until("waits held back by its image", waiting_for_image, 60)

    checkpoint = os.path.join(realnode.KUBELET_ROOT, "device-plugins",
                              "kubelet_internal_checkpoint")
    allocates = len(_events(s, "allocate"))
    s.node.stop_process("kubelet")
    os.remove(checkpoint)
    log_offset = os.path.getsize(os.path.join(s.node.logs, "kubelet.log"))
    s.node.start_kubelet()
    # Re-admitted: the kubelet allocates for "waits" again (its container
    # does not run), which dpproxy answers, and never fails it.
    wait_until("the kubelet allocating for waits again",
               lambda: len(_events(s, "allocate")) > allocates, 60)
    wait_until("waits held back by its image after the restart", waiting_for_image, 60)
    log = _kubelet_log_from(s.node, log_offset)
    check("UnexpectedAdmissionError" not in log,
          "the kubelet refused a pod at re-admission: %s" % "\n".join(
              line for line in log.splitlines() if "UnexpectedAdmissionError" in line)[:2000])
    check(_running_with(s, "run", container), "run did not keep its container: %s"
          % json.dumps(s.pod_json("run")["status"]))
    check(set(s.devices_of("run")) == held, "run's devices changed")
    s.node.kubectl("delete", "pod", "waits", "--wait=false")
    s.pod("next", 2, SCRIPT)
    s.wait_running("next", 120)
    _two_pods_disjoint(s, "run", "next")


class Background:
    """Work a test runs beside what it does (`with`): _run() on a thread of
    its own until the block ends and `stop` is set."""

    join_seconds = 30

    def __init__(self):
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(self.join_seconds)


class PodStream(Background):
    """Pods of one device each, created one after another while a test does
    something else: each is deleted once Running. Records every pod that
    failed or did not run within its deadline."""

    join_seconds = 120  # a pod's wait

    def __init__(self, s, prefix):
        self.s, self.prefix = s, prefix
        self.ran, self.failed = [], []
        super().__init__()

    def _run(self):
        i = 0
        while not self.stop.is_set():
            name = "%s%d" % (self.prefix, i)
            i += 1
            try:
                self.s.pod(name, 1, "echo READY; sleep 3600")
                self.s.wait_running(name, 60)
                self.ran.append(name)
            except (Failure, realnode.NodeError) as e:
                self.failed.append("%s: %s" % (name, e))
            self.s.node.kubectl("delete", "pod", name, "--wait=false", check=False)


class Prober(Background):
    """/livez and /readyz of the metrics address, asked one after the other
    without pause on a connection each, as a kubelet's probes and a
    monitoring system would: records every answer that is not 200 and
    every connection refused."""

    def __init__(self, port):
        self.port = port
        self.asked, self.bad = 0, []
        super().__init__()

    def _run(self):
        while not self.stop.is_set():
            for path in ("/livez", "/readyz"):
                self.asked += 1
                try:
                    c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                    c.request("GET", path)
                    r = c.getresponse()
                    body = r.read(200)
                    c.close()
                    if r.status != 200:
                        self.bad.append("%s %d %r" % (path, r.status, body))
                except OSError as e:
                    self.bad.append("%s: %s" % (path, e))


def _kubelet_log_from(node, offset):
    with open(os.path.join(node.logs, "kubelet.log"), errors="replace") as f:
        f.seek(offset)
        return f.read()


def _check_never_unhealthy(s, offset, what):
    """The kubelet's own log since `offset`: its healthy count of the
    scenario's resource never fell below DEVICES and it never marked the
    resource Unhealthy."""
    low, counts = [], 0
    for line in _kubelet_log_from(s.node, offset).splitlines():
        if ('resourceName="%s"' % s.resource) not in line:
            continue
        if "Mark all resources Unhealthy" in line:
            low.append(line)
        m = re.search(r"healthyCount=(\d+)", line)
        if m:
            counts += 1
            if int(m.group(1)) < DEVICES:
                low.append(line)
    # Each new registration's device list is counted (the kubelet logs it
    # at --v=4): none seen means the log says nothing either way.
    check(counts > 0, "the kubelet logged no device count for %s during %s"
          % (s.resource, what))
    check(not low, "during %s the kubelet saw fewer than %d healthy devices:\n%s"
          % (what, DEVICES, "\n".join(low[:5])))


def scenario_takeover_under_pods(s):
    """Three --takeover upgrades and one SIGUSR2 in-place upgrade on the same
    metrics address while pods keep coming: no pod fails, and the kubelet's
    healthy count never drops."""
    metrics = "--metrics_address=127.0.0.1:19101"
    old = s.dpproxy(metrics)
    s.plugin("v1beta1")
    s.wait_allocatable(DEVICES)

    def ready():
        try:
            c = http.client.HTTPConnection("127.0.0.1", 19101, timeout=5)
            c.request("GET", "/readyz")
            return c.getresponse().status == 200
        except OSError:
            return False
    wait_until("dpproxy ready at its metrics address", ready, 30)
    offset = os.path.getsize(os.path.join(s.node.logs, "kubelet.log"))
    with PodStream(s, "b") as stream, Prober(19101) as probes:
        wait_until("the first pod of the stream", lambda: stream.ran or stream.failed, 60)
        for i in range(3):
            new = s.dpproxy(metrics, "--takeover", name="dpproxy-takeover%d" % i)
            wait_until("dpproxy handing over to takeover %d" % i,
                       lambda: not old.alive(), 60)
            check(old.p.returncode == 0, "the dpproxy taken over exited with %d"
                  % old.p.returncode)
            check(new.alive(), "takeover %d exited with %s" % (i, new.p.returncode))
            seen = len(stream.ran) + len(stream.failed)
            wait_until("a pod of the stream after takeover %d" % i,
                       lambda: len(stream.ran) + len(stream.failed) > seen, 60)
            old = new
        old.p.send_signal(signal.SIGUSR2)
        wait_until("dpproxy handing over to its SIGUSR2 child", lambda: not old.alive(), 60)
        check(old.p.returncode == 0, "the dpproxy upgraded in place exited with %d"
              % old.p.returncode)
        seen = len(stream.ran) + len(stream.failed)
        wait_until("a pod of the stream after the in-place upgrade",
                   lambda: len(stream.ran) + len(stream.failed) > seen + 1, 60)
    check(not stream.failed, "pods failed during the upgrades:\n%s"
          % "\n".join(stream.failed))
    # Issue 52.4: whichever process answers, the probes stay 200.
    check(probes.asked > 100, "only %d probes were asked" % probes.asked)
    check(not probes.bad, "%d of %d probes were not answered 200 during the upgrades:\n%s"
          % (len(probes.bad), probes.asked, "\n".join(probes.bad[:10])))
    check(len(stream.ran) >= 5, "only %d pods ran during the upgrades" % len(stream.ran))
    _check_never_unhealthy(s, offset, "the upgrades")


DRIVER = "gpu.example.com"
DEVICE_CLASS = "gpu-example-com"


def dra_dpproxy(s, *extra, name="dpproxy"):
    """dpproxy in DRA mode as the driver DRIVER, with the identity
    deploy/dra-rbac.yaml gives it (a token of its service account)."""
    token = s.node.kubectl("create", "token", "dpproxy", "-n", "kube-system",
                           "--duration=2h").strip()
    kc = os.path.join(s.work, "dpproxy.kubeconfig")
    with open(kc, "w") as f:
        f.write("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n"
                "    server: https://127.0.0.1:%d\n    certificate-authority: %s/ca.crt\n"
                "users:\n- name: u\n  user:\n    token: %s\ncontexts:\n- name: c\n"
                "  context: {cluster: c, user: u}\ncurrent-context: c\n"
                % (realnode.PORTS["apiserver"], s.node.pki, token))
    return s.dpproxy("--kubelet_api=dra", "--dra_driver=" + DRIVER,
                     "--node_name=" + realnode.NODE_NAME, "--kubeconfig=" + kc,
                     "--cdi_dir=" + CDI_DIR, *extra, name=name)


def dra_setup(s):
    """The shipped RBAC, a DeviceClass of the driver (serving the extended
    resource of the scenario where the release has them: on by default
    from 1.36) and a claim template of one device, in resource.k8s.io/v1
    from 1.34 and v1beta1 on 1.32 and 1.33."""
    s.apply(os.path.join(ROOT, "deploy", "dra-rbac.yaml"))
    v1 = s.minor >= 34
    group = "resource.k8s.io/v1" if v1 else "resource.k8s.io/v1beta1"
    spec = {"selectors": [{"cel": {"expression": 'device.driver == "%s"' % DRIVER}}]}
    if s.minor >= 36:
        spec["extendedResourceName"] = s.resource
    s.apply_json({"apiVersion": group, "kind": "DeviceClass",
                  "metadata": {"name": DEVICE_CLASS}, "spec": spec})
    request = {"name": "gpu"}
    if v1:
        request["exactly"] = {"deviceClassName": DEVICE_CLASS, "count": 1}
    else:
        request.update({"deviceClassName": DEVICE_CLASS, "count": 1})
    s.apply_json({
        "apiVersion": group, "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [request]}}}})


def slice_devices(s):
    """The devices the node's ResourceSlices of DRIVER publish."""
    names = []
    for sl in s.node.get_json("resourceslices")["items"]:
        spec = sl["spec"]
        if spec.get("driver") == DRIVER and spec.get("nodeName") == realnode.NODE_NAME:
            names += [d["name"] for d in spec.get("devices", [])]
    return sorted(names)


def claim_pod(s, name):
    """A pod whose container uses one device through a claim made from the
    template one-gpu."""
    manifest = pod_manifest(name, SCRIPT, {"claims": [{"name": "gpu"}]})
    manifest["spec"]["resourceClaims"] = [{"name": "gpu",
                                           "resourceClaimTemplateName": "one-gpu"}]
    s.apply_json(manifest)
    s.pods.append(name)
    return name


def scenario_dra(s):
    """DRA mode on the real node: the plugin's devices published in
    ResourceSlices, a claim prepared with its CDI spec and the plugin's env,
    mounts, device nodes and CDI devices inside the container, a pod of the
    extended resource served through DRA, then a kubelet restart, a
    --takeover and a dpproxy SIGKILL, each followed by a pod that starts,
    with no device in two running pods."""
    dra_setup(s)
    proxy = dra_dpproxy(s)
    s.plugin("v1beta1")
    wait_until("the node's slices of %s list %d devices" % (DRIVER, DEVICES),
               lambda: len(slice_devices(s)) == DEVICES, 60)
    claim_pod(s, "c1")
    s.wait_running("c1")
    check_inside(s, "c1", "v1beta1", 1, cdi=True)
    live = ["c1"]
    if s.minor >= 36:
        s.pod("x1", 1, SCRIPT)  # the extended resource, served by a claim
        s.wait_running("x1")
        check_inside(s, "x1", "v1beta1", 1, cdi=True)
        _two_pods_disjoint(s, "c1", "x1")
        live.append("x1")
    running = {p: s.container_id(p) for p in live}

    s.node.restart_kubelet()
    claim_pod(s, "c2")
    s.wait_running("c2", 120)
    check_inside(s, "c2", "v1beta1", 1, cdi=True)

    log_offset = os.path.getsize(os.path.join(s.node.logs, "kubelet.log"))
    new = dra_dpproxy(s, "--takeover", name="dpproxy-takeover")
    wait_until("dpproxy handing over to the takeover", lambda: not proxy.alive(), 60)
    check(proxy.p.returncode == 0, "the dpproxy taken over exited with %d"
          % proxy.p.returncode)
    if s.minor >= 33:
        # Issue 52.3: the kubelet forgets the old instance (its registration
        # socket deleted) and keeps the new one: one live instance.
        reg = os.path.join(realnode.KUBELET_ROOT, "plugins_registry", DRIVER + "-reg")

        def unregistered(name):
            return [line for line in _kubelet_log_from(s.node, log_offset).splitlines()
                    if "UnregisterPlugin started" in line and '"%s"' % name in line]
        wait_until("the kubelet unregistering the old instance",
                   lambda: unregistered(reg + ".sock"), 30)
        check(not unregistered(reg + "-1.sock"),
              "the kubelet unregistered the new instance: %s" % unregistered(reg + "-1.sock"))
    s.node.kubectl("delete", "pod", "c2", "--wait=false")
    claim_pod(s, "c3")
    s.wait_running("c3", 120)
    check_inside(s, "c3", "v1beta1", 1, cdi=True)

    new.kill(signal.SIGKILL)
    log_offset = os.path.getsize(os.path.join(s.node.logs, "kubelet.log"))
    dra_dpproxy(s, name="dpproxy-after-kill")
    if s.minor >= 33:
        # The killed one's registration (generation 1) was left behind: the
        # next dpproxy removes it, and the kubelet forgets that dead
        # instance instead of keeping it (and, on 1.36, retrying its health
        # stream every 5 s).
        dead = os.path.join(realnode.KUBELET_ROOT, "plugins_registry", DRIVER + "-reg-1.sock")
        wait_until("the kubelet unregistering the killed dpproxy's instance",
                   lambda: [line for line in _kubelet_log_from(s.node, log_offset).splitlines()
                            if "UnregisterPlugin started" in line and '"%s"' % dead in line], 60)
        check(not os.path.exists(dead), "%s is still there" % dead)
        check([e for e in _events(s, "dra_dead_instance_removed")
               if e.get("registration") == dead],
              "dpproxy did not say it removed %s" % dead)
    wait_until("c2 gone", lambda: "c2" not in [
        p["metadata"]["name"] for p in s.node.get_json("pods")["items"]], 60)
    claim_pod(s, "c4")
    s.wait_running("c4", 120)
    check_inside(s, "c4", "v1beta1", 1, cdi=True)
    for pod, container in running.items():
        check(_running_with(s, pod, container), "%s did not keep its container: %s"
              % (pod, json.dumps(s.pod_json(pod)["status"])))
    live += ["c3", "c4"]
    for i, a in enumerate(live):
        for b in live[i + 1:]:
            _two_pods_disjoint(s, a, b)


def _events(s, name):
    """dpproxy's events named `name`, from the scenario's events file."""
    out = []
    path = os.path.join(s.work, "events.jsonl")
    if os.path.exists(path):
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("event") == name:
                    out.append(e)
    return out


def scenario_move_to_dra(s, fence=True):
    """A resource served both ways moved to DRA by a reload while pods of
    the extended resource are created from that moment on. The
    scheduler routes each by the node's status, which the kubelet writes
    every 10 s: without dpproxy's fence a pod routed to the device plugin
    on the stale status is refused by the kubelet ("no healthy devices
    present") and fails for good. Every pod must start, the node's taint
    must come and go, and the node's status must end at 0."""
    proxy, write_config = _both_ways_node(s, "both", fence=fence)
    write_config("dra")
    proxy.p.send_signal(signal.SIGHUP)
    pods = [s.pod("m%d" % i, 1, SCRIPT, tolerate=False) for i in range(DEVICES)]
    for p in pods:
        s.wait_running(p, 120)
    for i, a in enumerate(pods):
        for b in pods[i + 1:]:
            _two_pods_disjoint(s, a, b)
    if fence:
        check(_events(s, "move_fence_raised"), "dpproxy never tainted the node")
        wait_until("the node's taint lowered", lambda: bool(_events(s, "move_fence_lowered")), 60)
        taints = s.node.get_json("node", realnode.NODE_NAME)["spec"].get("taints", [])
        check(not [t for t in taints if t.get("key") == "dpproxy/moving"],
              "the node keeps dpproxy's taint: %s" % json.dumps(taints))
    s.wait_allocatable(0, 60)


def _both_ways_node(s, path, devices=DEVICES, fence=True, plugin_flags=(), proxy_flags=()):
    """dpproxy (with `proxy_flags`) serving the scenario's resource through
    `path` (both, dra), with dra.move_fence `fence`, the sample plugin of
    `devices` devices,
    the node's allocatable and the pool showing them; returns dpproxy and
    a function that rewrites its configuration with another path."""
    dra_setup(s)
    config = os.path.join(s.work, "dpproxy.yaml")

    def write_config(p):
        with open(config, "w") as f:
            f.write("paths: {%s: %s}\n" % (s.resource, p))
            if not fence:
                f.write("dra: {move_fence: false}\n")
    write_config(path)
    proxy = dra_dpproxy(s, "--config=" + config, *proxy_flags)
    s.plugin("v1beta1", *plugin_flags, devices=devices)
    s.wait_allocatable(devices, 60)
    wait_until("the node's slices of %s list %d devices" % (DRIVER, devices),
               lambda: len(slice_devices(s)) == devices, 60)
    return proxy, write_config


def _through_claim(s, pod):
    """Whether the scheduler served the pod's extended resource by a claim
    of its own (the DRA route), from the pod's status."""
    return bool(s.pod_json(pod)["status"].get("extendedResourceClaimStatus"))


def _unschedulable(s, pod):
    """The scheduler's FailedScheduling events of the pod, as text."""
    out = s.node.kubectl("get", "events", "-n", "default", "-o", "json", "--field-selector",
                         "involvedObject.name=%s,reason=FailedScheduling" % pod)
    return ["%s: %s" % (e.get("lastTimestamp"), e.get("message"))
            for e in json.loads(out)["items"]]


# The kubelet drops a stopped device plugin's endpoint this long after it
# stopped (endpointStopGracePeriod, pkg/kubelet/cm/devicemanager/types.go),
# at its next GetCapacity (each node-status update: every second on the
# test node, nodeStatusUpdateFrequency in tools/realnode/realnode.py).
ENDPOINT_STOP_GRACE = 5 * 60
NODE_STATUS_PERIOD = 1


def scenario_dra_after_endpoint_grace(s):
    """Issue 59.2: a resource moved to DRA while a pod of its device plugin
    runs. More than the kubelet's endpoint grace later, a new pod of the
    extended resource (served by a claim) starts: the kubelet looks the
    resource's endpoint up at every container start while any pod holds
    its devices through the device plugin (GetDeviceRunContainerOptions),
    so dpproxy keeps it registered, withdrawn, until that pod ends. Then
    the endpoint goes and the next pod starts as well."""
    proxy, write_config = _both_ways_node(s, "both")
    s.pod("legacy", 1, SCRIPT, tolerate=False)
    s.wait_running("legacy")
    check(not _through_claim(s, "legacy"), "legacy was served by a claim, not the device plugin")
    legacy = s.container_id("legacy")
    write_config("dra")
    proxy.p.send_signal(signal.SIGHUP)
    moved = time.monotonic()
    s.wait_allocatable(0, 60)
    wait_until("the node's taint lowered", lambda: bool(_events(s, "move_fence_lowered")), 60)
    check(_events(s, "device_plugin_withdrawn"), "dpproxy did not keep the endpoint withdrawn")
    # What the scenario is about is the kubelet's own timer, which nothing
    # outside it shows: the pod is created once the grace and a status
    # period have passed. Meanwhile the device plugin's pod runs on.
    wait_until("the endpoint grace passed since the move, legacy running",
               lambda: (check(_running_with(s, "legacy", legacy), "legacy stopped running")
                        or time.monotonic() - moved > ENDPOINT_STOP_GRACE + 2 * NODE_STATUS_PERIOD),
               ENDPOINT_STOP_GRACE + 3 * NODE_STATUS_PERIOD + 30)
    s.pod("x1", 1, SCRIPT, tolerate=False)
    s.wait_running("x1", 120)
    check(_through_claim(s, "x1"), "x1 was not served by a claim")
    check_inside(s, "x1", "v1beta1", 1, cdi=True)
    _two_pods_disjoint(s, "legacy", "x1")
    # The last pod of the device plugin ends: the endpoint stops, and a new
    # pod still starts.
    s.node.kubectl("delete", "pod", "legacy", "--wait=true", "--timeout=60s")
    s.pod("x2", 1, SCRIPT, tolerate=False)
    s.wait_running("x2", 120)
    check(_through_claim(s, "x2"), "x2 was not served by a claim")
    _two_pods_disjoint(s, "x1", "x2")


def scenario_both_one_device_free(s):
    """Issue 59.3 and 59.4: one resource of two devices served both ways.
    With exactly one device free the next pod runs, whichever way it comes:
    a pod of the extended resource beside a claim's pod (capacity counted
    once), the same after the claim's pod ends, and a claim's pod after a
    pod of the device plugin ends (its device back in the pool at the next
    pass, not after the reconciliation grace). None is ever refused by the
    scheduler while a device is free."""
    _both_ways_node(s, "both", devices=2)
    claim_pod(s, "c1")
    s.wait_running("c1")
    # The claim's device Unhealthy to the device manager: one left.
    s.wait_allocatable(1, 60)
    s.pod("x1", 1, SCRIPT, tolerate=False)
    s.wait_running("x1", 60)
    check(not _through_claim(s, "x1"), "x1 was served by a claim, not the device plugin")
    _two_pods_disjoint(s, "c1", "x1")

    s.node.kubectl("delete", "pod", "c1", "--wait=true", "--timeout=60s")
    # The kubelet writes the returned device into the node's status (every
    # 10 s); the scheduler counts x1's request against it: one free.
    s.wait_allocatable(2, 60)
    s.pod("x2", 1, SCRIPT, tolerate=False)
    s.wait_running("x2", 60)
    _two_pods_disjoint(s, "x1", "x2")

    # x1's device goes back to the pool once dpproxy sees x1 gone from the
    # kubelet (at its next pass), well inside the reconciliation grace (5
    # minutes from x1's allocation) that alone would let it wait.
    s.node.kubectl("delete", "pod", "x1", "--wait=true", "--timeout=60s")
    claim_pod(s, "c2")
    s.wait_running("c2", 120)
    _two_pods_disjoint(s, "x2", "c2")
    for p in ("x1", "x2"):
        bad = _unschedulable(s, p)
        check(not bad, "the scheduler refused %s while a device was free:\n%s"
              % (p, "\n".join(bad)))


def podresources(s, socket, what):
    """A real client's answer (our client of the API k8s.io/kubelet
    generates, tools/realnode/modules/podresources) from a pod-resources
    socket: what = list or allocatable, as parsed JSON."""
    return json.loads(realnode.run([s.node.part_bin("podresources", "podresources"),
                                    "--socket=" + socket, what], timeout=30))


def _listed(answer, resource, pod=None):
    """The device IDs a pod-resources answer lists the device-plugin way
    under `resource`: of pod `pod`'s containers (List), or allocatable."""
    ids = []
    if pod is None:
        devices = answer.get("devices") or []
    else:
        devices = [d for p in answer.get("pod_resources") or []
                   if p.get("name") == pod and p.get("namespace") == "default"
                   for c in p.get("containers") or [] for d in c.get("devices") or []]
    for d in devices:
        if d.get("resource_name") == resource:
            ids += d.get("device_ids") or []
    return sorted(ids)


KUBELET_POD_RESOURCES = os.path.join(realnode.KUBELET_ROOT, "pod-resources", "kubelet.sock")


def scenario_pod_resources_real_client(s):
    """dpproxy's pod-resources view (--pod_resources_socket) read by a real
    client (the one Kubernetes generates, as monitoring agents use it):
    a pod of the device plugin is listed with the devices inside its
    container, as the kubelet's own socket lists it, and allocatable lists
    every device. From 1.36, with the resource served both ways, a claim's
    pod is listed the device-plugin way too (resource name and the plugin's
    device ID, which the kubelet lists only as a claim), and allocatable
    still lists the device the claim holds, which the kubelet's leaves out."""
    view = "--pod_resources_socket=" + os.path.join(s.work, "pod-resources.sock")
    both = s.minor >= 36
    if both:
        _both_ways_node(s, "both", proxy_flags=(view,))
    else:
        s.dpproxy(view)
        s.plugin("v1beta1")
        s.wait_allocatable(DEVICES)
    view = view.split("=", 1)[1]
    wait_until("dpproxy's pod-resources socket", lambda: os.path.exists(view), 30)
    s.pod("p1", 2, SCRIPT)
    s.wait_running("p1")
    devs = check_inside(s, "p1", "v1beta1", 2)
    ours = podresources(s, view, "list")
    theirs = podresources(s, KUBELET_POD_RESOURCES, "list")
    check(_listed(ours, s.resource, "p1") == devs, "dpproxy's view lists p1 with %s, not its "
          "devices %s:\n%s" % (_listed(ours, s.resource, "p1"), devs, json.dumps(ours)))
    check(_listed(theirs, s.resource, "p1") == devs, "the kubelet lists p1 with %s, not %s"
          % (_listed(theirs, s.resource, "p1"), devs))
    every = sorted("%s-%d" % (s.resource.split("/")[1], i) for i in range(DEVICES))
    got = _listed(podresources(s, view, "allocatable"), s.resource)
    check(got == every, "dpproxy's view lists %s allocatable, not %s" % (got, every))
    if not both:
        return
    claim_pod(s, "c1")
    s.wait_running("c1")
    held = check_inside(s, "c1", "v1beta1", 1)
    ours = podresources(s, view, "list")
    check(_listed(ours, s.resource, "c1") == held, "dpproxy's view lists the claim's pod c1 "
          "with %s under %s, not its device %s:\n%s"
          % (_listed(ours, s.resource, "c1"), s.resource, held, json.dumps(ours)))
    theirs = podresources(s, KUBELET_POD_RESOURCES, "list")
    check(_listed(theirs, s.resource, "c1") == [], "the kubelet lists c1 the device-plugin "
          "way itself: %s" % _listed(theirs, s.resource, "c1"))
    got = _listed(podresources(s, view, "allocatable"), s.resource)
    check(got == every, "with a claim held, dpproxy's view lists %s allocatable, not %s"
          % (got, every))


def _status_health(s, pod, name):
    """The healths the pod's allocatedResourcesStatus entry `name` lists
    (the resource's name, or "claim:<request>" for a claim's devices,
    whose resourceID is the CDI device)."""
    out = []
    for c in s.pod_json(pod)["status"].get("containerStatuses", []):
        for r in c.get("allocatedResourcesStatus") or []:
            if r.get("name") == name:
                out += [d.get("health", "") for d in r.get("resources") or []]
    return out


def scenario_health_in_pod_status(s):
    """A device the plugin turns Unhealthy shows so in the status of the
    pod that holds it, on both paths: a pod of the device plugin (the
    device manager's health) and a claim's pod (the DRA health stream
    dpproxy serves: v1 to a 1.37 kubelet, v1alpha1 to 1.36)."""
    control = os.path.join(s.work, "plugin.ctl")
    _both_ways_node(s, "both", plugin_flags=("--control_socket=" + control,))
    s.pod("d1", 1, SCRIPT, tolerate=False)
    claim_pod(s, "c1")
    s.wait_running("d1")
    s.wait_running("c1")
    for pod, name in (("d1", s.resource), ("c1", "claim:gpu")):
        (device,) = s.devices_of(pod)
        wait_until("%s's status showing %s Healthy" % (pod, device),
                   lambda: _status_health(s, pod, name) == ["Healthy"], 60)
        realnode.run([s.args.sample_plugin, "set-health", "--control_socket=" + control,
                      "--device=" + device, "--health=Unhealthy"])
        wait_until("%s's status showing %s Unhealthy" % (pod, device),
                   lambda: _status_health(s, pod, name) == ["Unhealthy"], 90)


def _dpctl(s, *args):
    return realnode.run([s.args.dpctl, "--state_dir=" + os.path.join(s.work, "state")]
                        + list(args))


def scenario_cordon_in_pod_status(s):
    """A device cordoned by hand (dpctl cordon) shows Unhealthy in the
    status of the pod that holds it, on both paths (a pod of the device
    plugin, a claim's pod), and the pod runs on, its container never
    restarted; the node's allocatable drops by the pod's device (the
    claim's is not the device plugin's to count already); uncordoned, the
    devices show Healthy again."""
    _both_ways_node(s, "both")
    s.pod("d1", 1, SCRIPT, tolerate=False)
    claim_pod(s, "c1")
    s.wait_running("d1")
    s.wait_running("c1")
    # The claim's device is not the device manager's: DEVICES - 1, once the
    # node's status (every 10 s) says so.
    s.wait_allocatable(DEVICES - 1, 60)
    cordoned = []
    for pod, name in (("d1", s.resource), ("c1", "claim:gpu")):
        (device,) = s.devices_of(pod)
        wait_until("%s's status showing %s Healthy" % (pod, device),
                   lambda: _status_health(s, pod, name) == ["Healthy"], 60)
        _dpctl(s, "cordon", s.resource, device, "--reason=e2e: taken out by hand")
        cordoned.append(device)
        wait_until("%s's status showing the cordoned %s Unhealthy" % (pod, device),
                   lambda: _status_health(s, pod, name) == ["Unhealthy"], 90)
    listed = _dpctl(s, "cordons", "--output=json")
    check(sorted(c["device"] for c in json.loads(listed)["cordons"]) == sorted(cordoned),
          "dpctl cordons lists %s, not %s" % (listed, cordoned))
    for pod in ("d1", "c1"):
        st = s.pod_json(pod)["status"]
        check(st.get("phase") == "Running", "%s is %s with its device cordoned" % (
            pod, st.get("phase")))
        restarts = [c.get("restartCount", 0) for c in st.get("containerStatuses", [])]
        check(restarts == [0] * len(restarts), "%s's containers restarted: %s" % (pod, restarts))
    s.wait_allocatable(DEVICES - 2, 60)
    for device in cordoned:
        _dpctl(s, "uncordon", s.resource, device)
    for pod, name in (("d1", s.resource), ("c1", "claim:gpu")):
        wait_until("%s's status showing its device Healthy again" % pod,
                   lambda: _status_health(s, pod, name) == ["Healthy"], 90)
    s.wait_allocatable(DEVICES - 1, 60)


def scenario_silent_plugin(s):
    """A plugin stopped with SIGSTOP (its stream open, nothing answered):
    dpproxy's watchdog finds it silent, the node's allocatable drops to 0
    so the kubelet admits no pod to it, and the pod holding a device runs
    on; resumed, the devices are Healthy again and a new pod starts."""
    s.dpproxy("--backend_probe_interval=1s", "--backend_probe_timeout=1s",
              "--backend_probe_misses=2")
    plugin = s.plugin("v1beta1")
    s.wait_allocatable(DEVICES, 60)
    s.pod("p1", 1)
    s.wait_running("p1")
    os.kill(plugin.p.pid, signal.SIGSTOP)
    try:
        wait_until("the node's allocatable of %s at 0" % s.resource,
                   lambda: s.allocatable() == 0, 60)
        check("plugin silent for" in open(os.path.join(s.work, "events.jsonl")).read(),
              "no backend_silent event naming how long the plugin was silent")
        check(s.pod_json("p1")["status"].get("phase") == "Running", "p1 stopped running")
    finally:
        os.kill(plugin.p.pid, signal.SIGCONT)
    s.wait_allocatable(DEVICES, 60)
    s.pod("p2", 1)
    s.wait_running("p2")


K8S_SAMPLE_RESOURCE = "example.com/resource"


def k8s_sample_plugin(s, name="k8s-sample-plugin"):
    """Kubernetes' own e2e sample device plugin, built from this release's
    k8s.io/kubernetes. It registers only at the kubelet's own path,
    /var/lib/kubelet/device-plugins/kubelet.sock, as many field plugins
    do: it runs in a mount namespace of its own where dpproxy's plugin
    directory is bind-mounted over that path, as a DaemonSet pod would
    mount it."""
    binary = s.node.kube_bin("sample-device-plugin")
    check(os.access(binary, os.X_OK), "%s is not built (tools/realnode/build)" % binary)
    for dev in ("Dev-1", "Dev-2"):  # the files its Allocate creates and mounts
        s.host_paths.append("/tmp/" + dev)
    s.host_paths.append(CDI_DIR + "/example.com.json")  # its CDI spec, in a directory
    os.makedirs(CDI_DIR, exist_ok=True)                 # it expects to exist
    os.makedirs(s.plugin_dir(), exist_ok=True)
    target = os.path.join(realnode.KUBELET_ROOT, "device-plugins")
    p = Proc(name, ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                    # (Its 1.26 build has no default for PLUGIN_SOCK_DIR.)
                    'mount --bind "$1" "$2" && '
                    'exec env CDI_ENABLED=1 PLUGIN_SOCK_DIR="$2" "$3" --v=4',
                    "sh", s.plugin_dir(), target, binary], s.work).start()
    s.procs.append(p)
    return p


def scenario_k8s_sample_device_plugin(s):
    """Kubernetes' e2e sample device plugin behind dpproxy (a v1beta1 plugin
    that hard-codes the kubelet's socket path): its mount in the container,
    and its CDI device from 1.29 on; after dpproxy is killed with SIGKILL
    and started again the plugin is connected again and the next pod gets
    the other device."""
    proxy = s.dpproxy()
    k8s_sample_plugin(s)
    s.wait_allocatable(2, resource=K8S_SAMPLE_RESOURCE)
    script = "ls /tmp; env | grep ^CDI_DEVICE; echo READY; sleep 3600"
    s.pod("k1", 1, script, resource=K8S_SAMPLE_RESOURCE)
    s.wait_running("k1")

    def device_of(pod):
        text = s.wait_log(pod, "READY")
        devs = [line for line in text.splitlines() if line in ("Dev-1", "Dev-2")]
        check(len(devs) == 1, "%s: the plugin's mount /tmp/Dev-N is not in the container "
              "once:\n%s" % (pod, text))
        if s.minor >= 29:
            check("CDI_DEVICE=CDI-%s" % devs[0] in text, "%s: the plugin's CDI device "
                  "CDI-%s did not reach the container:\n%s" % (pod, devs[0], text))
        return devs[0]

    first = device_of("k1")
    before = s.container_id("k1")
    proxy.kill(signal.SIGKILL)
    s.dpproxy(name="dpproxy2")
    s.pod("k2", 1, script, resource=K8S_SAMPLE_RESOURCE)
    s.wait_running("k2", 90)
    second = device_of("k2")
    check(second != first, "k2 was given %s, which k1 holds" % first)
    check(_running_with(s, "k1", before), "k1 did not keep its container")


def dpconform_real(s, plugin_flags, *flags):
    """dpconform (--dpconform) on this node's real kubelet with the sample
    plugin registered at the kubelet's own socket; its exit status and
    JSON report."""
    check(s.args.dpconform, "--dpconform (the dpconform binary) is not given")
    resource = "example.com/conform"
    s.device_nodes("conform", DEVICES, prefix="dev")  # the plugin's default IDs
    s.host_paths.append("%s/sample-plugin-%s.json" % (CDI_DIR, resource.replace("/", "-")))
    plugin = " ".join([s.args.sample_plugin, "--api=v1beta1", "--resource=" + resource,
                       "--devices=%d" % DEVICES, "--kubelet_socket={kubelet_socket}",
                       "--socket_name=dpconform-sample.sock", "--cdi_dir=" + CDI_DIR,
                       "--control_socket={work_dir}/control.sock", "--quiet"]
                      + list(plugin_flags))
    health = (s.args.sample_plugin + " set-health --control_socket={work_dir}/control.sock"
              " --device={device} --health={health}")
    restart = "%s %s restart-kubelet --dir=%s" % (
        sys.executable, os.path.join(ROOT, "tools", "realnode", "realnode.py"), s.node.dir)
    work = tempfile.mkdtemp(prefix="dpc.", dir="/tmp")
    s.at_end.append(lambda: shutil.rmtree(work, ignore_errors=True))
    args = [s.args.dpconform, "--kubelets=real:%s" % s.node.release.rsplit(".", 1)[0],
            "--resource=" + resource, "--plugin=" + plugin, "--health_command=" + health,
            "--restart_kubelet=" + restart, "--kubeconfig=" + s.node.admin_kubeconfig,
            "--pod_image=" + realnode.BUSYBOX_IMAGE, "--timeout=30s", "--output=json",
            "--work_dir=" + work, "--quiet"] + list(flags)
    return run_dpconform(s, args, "-".join(flags or ["all"])[:100])


def run_dpconform(s, args, label):
    """Runs dpconform with `args` (it writes its report as JSON), keeps its
    output under the scenario's logs as dpconform-<label>.log; its exit
    status and report."""
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=900)
    with open(os.path.join(s.work, "dpconform-%s.log" % label.replace("/", "_").replace(
            "=", "_")), "wb") as f:
        f.write(p.stdout + b"\n" + p.stderr)
    try:
        report = json.loads(p.stdout)
    except ValueError:
        raise Failure("dpconform (exit %d) wrote no JSON report: %s" % (
            p.returncode, p.stderr.decode()[-2000:]))
    return p.returncode, report


def _cells(report):
    return {c["scenario"]: c for c in report["cells"]}


def scenario_dpconform_k8s_sample_grid(s):
    """dpconform as a plugin's authors would run it in CI: Kubernetes' own
    e2e sample device plugin, built from this release's module, against
    the newest simulated kubelet of each generation, with its known limitations
    declared in tests/realnode/testdata/k8s-sample-device-plugin.expect.
    The plugin hard-codes the kubelet's socket path, so each cell runs it in
    a mount namespace of its own, a tmpfs over /var/lib holding that path
    with the cell's device-plugins/ directory bind-mounted on it, as a
    DaemonSet pod would mount it. No new failure, every release from 1.25 passes every
    cell that applies (the simulated kubelets agree with the real one this
    plugin works with), and dpconform prints the run's wall time."""
    check(s.args.dpconform, "--dpconform (the dpconform binary) is not given")
    binary = s.node.kube_bin("sample-device-plugin")
    check(os.access(binary, os.X_OK), "%s is not built (tools/realnode/build)" % binary)
    for dev in ("Dev-1", "Dev-2"):  # the files its Allocate creates
        s.host_paths.append("/tmp/" + dev)
    # A tmpfs over the root's parent in the plugin's own mount namespace
    # holds the path it hard-codes, so the node's directory is never used.
    parent = os.path.dirname(realnode.KUBELET_ROOT)
    plugin = ("exec unshare --mount --propagation private -- /bin/sh -c "
              "'mount -t tmpfs dpconform %s && mkdir -p %s/device-plugins && "
              "mount --bind \"$1\" %s/device-plugins && "
              "exec env PLUGIN_SOCK_DIR=%s/device-plugins \"$2\"' sh {plugin_dir} %s"
              % (parent, realnode.KUBELET_ROOT, realnode.KUBELET_ROOT, realnode.KUBELET_ROOT,
                 binary))
    expect = os.path.join(ROOT, "tests", "realnode", "testdata",
                          "k8s-sample-device-plugin.expect")
    work = tempfile.mkdtemp(prefix="dpc.", dir="/tmp")
    s.at_end.append(lambda: shutil.rmtree(work, ignore_errors=True))
    # The newest release of each generation (dpconform's default): the
    # whole grid is `tools/dev bench conform`'s.
    args = [s.args.dpconform, "--resource=example.com/resource",
            "--plugin=" + plugin, "--expect=" + expect, "--output=json", "--work_dir=" + work,
            "--quiet"]
    rc, report = run_dpconform(s, args, "k8s-sample-grid")
    new = ["%s on %s: %s %s" % (c["scenario"], c["kubelet"], c["outcome"], c["summary"])
           for c in report["cells"]
           if c["outcome"] in ("fail", "blocked") and not c.get("known")]
    check(rc == 0 and not new, "new failures of the e2e sample plugin (exit %d):\n%s"
          % (rc, "\n".join(new)))
    late = [c for c in report["cells"] if int(c["kubelet"].split(".")[1]) >= 25]
    bad = ["%s on %s: %s" % (c["scenario"], c["kubelet"], c["outcome"]) for c in late
           if c["outcome"] not in ("pass", "n/a")]
    check(late and not bad, "the e2e sample plugin did not pass on 1.25 and later:\n%s"
          % "\n".join(bad))
    check(report.get("wall_seconds", 0) > 0, "the report has no wall time")
    print("e2e: dpconform-k8s-sample-plugin-grid: %d cells in %.0f s" % (
        len(report["cells"]), report["wall_seconds"]), file=sys.stderr, flush=True)


def scenario_dpconform_real(s):
    """dpconform on the real kubelet: the sample plugin, registered at the
    kubelet's own socket, passes every scenario a real kubelet can judge,
    and the report names the kubelet's version; killed with the kubelet's
    Allocate unread it has its pod failed and comes back; the same plugin
    made not to register again after a kubelet restart fails kubelet-restart
    there, one that cannot listen over its killed process's socket fails
    allocate-restart, its list grown past 4 MiB fails list-growth (the
    kubelet lists no device after it), and one whose Allocate fails fails
    allocate with the kubelet's own error."""
    rc, report = dpconform_real(s, [])
    cells = _cells(report)
    want = ["registers", "device-list", "health", "allocate", "allocate-two",
            "kubelet-restart", "plugin-restart", "allocate-restart", "list-growth",
            "plugin-watcher", "multi-resource"]
    check(sorted(cells) == sorted(want), "dpconform ran %s on the real kubelet, not %s"
          % (sorted(cells), sorted(want)))
    # n/a: list-growth without --grow_command, plugin-watcher for a plugin
    # registering at kubelet.sock, multi-resource with one resource (each
    # run below with what it needs).
    not_applicable = {"list-growth", "plugin-watcher", "multi-resource"}
    bad = ["%s: %s %s" % (n, c["outcome"], c["summary"]) for n, c in cells.items()
           if c["outcome"] != ("n/a" if n in not_applicable else "pass")]
    check(not bad and rc == 0, "the sample plugin did not pass on the real kubelet (exit %d):\n%s"
          % (rc, "\n".join(bad)))
    version = realnode.run([s.node.kube_bin("kubelet"), "--version"]).split()[-1]
    check(all(c["generation"] == "real kubelet " + version for c in cells.values()),
          "the report does not name the real kubelet %s: %s" % (
              version, sorted({c["generation"] for c in cells.values()})))

    # Registered through the kubelet's plugin watcher, two resources from
    # one process: the kubelet lists the registration socket among the
    # plugins it registered, and a pod of both runs.
    second = "example.com/conform2"
    s.host_paths.append("%s/sample-plugin-%s.json" % (CDI_DIR, second.replace("/", "-")))
    rc, report = dpconform_real(
        s, ["--registration=plugin-watcher", "--plugins_registry_dir={plugins_registry}",
            "--resource=example.com/conform," + second, "--socket_name="],
        "--scenarios=plugin-watcher,multi-resource", "--resource=example.com/conform," + second)
    watched = _cells(report)
    bad = ["%s: %s %s" % (n, c["outcome"], c["summary"]) for n, c in watched.items()
           if c["outcome"] != "pass"]
    check(rc == 0 and sorted(watched) == ["multi-resource", "plugin-watcher"] and not bad,
          "the sample plugin through the plugin watcher with two resources did not pass "
          "(exit %d): %s" % (rc, bad or sorted(watched)))
    check("plugins_registry" in watched["plugin-watcher"]["summary"],
          "plugin-watcher does not name the registration socket: %s" % watched["plugin-watcher"])

    rc, report = dpconform_real(s, ["--fault=no-reregister"], "--scenarios=kubelet-restart")
    cell = _cells(report).get("kubelet-restart", {})
    check(rc == 1 and cell.get("outcome") == "fail" and "after the kubelet's restart"
          in cell.get("summary", ""),
          "a plugin that does not register again was not failed on kubelet-restart "
          "(exit %d): %s" % (rc, cell))

    # Killed with the kubelet's call unread: the kubelet fails that pod, and
    # a plugin that cannot listen where its killed process left the socket
    # file never comes back.
    restart = cells.get("allocate-restart", {})
    check(any("unread in its socket" in n for n in restart.get("notes", [])) and
          any("UnexpectedAdmissionError" in n for n in restart.get("notes", [])),
          "allocate-restart did not see the kubelet fail the pod whose call was unread: %s"
          % restart)
    # A list grown past 4 MiB: the real kubelet shows every device at twice
    # the count, then none (its stream ended), and the plain plugin never
    # comes back.
    grow = ("--grow_command=%s set-devices --control_socket={work_dir}/control.sock "
            "--count={count} >/dev/null" % s.args.sample_plugin)
    rc, report = dpconform_real(s, [], "--scenarios=list-growth", grow)
    cell = _cells(report).get("list-growth", {})
    check(rc == 1 and cell.get("outcome") == "fail" and "no allocatable device"
          in cell.get("summary", "") and
          any("listed as allocatable" in n for n in cell.get("notes", [])),
          "the sample plugin's list grown past 4 MiB was not failed on list-growth as the "
          "real kubelet dropped it (exit %d): %s" % (rc, cell))

    rc, report = dpconform_real(s, ["--fault=stale-socket-blocks"],
                                "--scenarios=allocate-restart")
    cell = _cells(report).get("allocate-restart", {})
    check(rc == 1 and cell.get("outcome") == "fail" and "address already in use"
          in cell.get("plugin_did", ""),
          "a plugin that cannot listen over its left socket was not failed on "
          "allocate-restart (exit %d): %s" % (rc, cell))

    rc, report = dpconform_real(s, ["--fail_allocate=dpconform-e2e-refused"],
                                "--scenarios=allocate")
    cell = _cells(report).get("allocate", {})
    check(rc == 1 and cell.get("outcome") == "fail" and "dpconform-e2e-refused"
          in cell.get("users_see", ""),
          "a plugin whose Allocate fails was not failed on allocate with the kubelet's "
          "error (exit %d): %s" % (rc, cell))


TEST_DRIVER = "test-driver.cdi.k8s.io"


def dpconform_dra_driver(s, driver_flags, *flags):
    """dpconform --dra_driver on its simulated DRA releases with Kubernetes'
    own DRA test driver of this release (a real driver on upstream's
    kubelet-plugin helper, speaking Kubernetes protobuf to the API server);
    its exit status and JSON report."""
    check(s.args.dpconform, "--dpconform (the dpconform binary) is not given")
    driver = s.node.kube_bin("test-driver")
    plugin = ("mkdir -p {kubelet_root}/plugins/{driver} && exec %s --kubeconfig={kubeconfig} "
              "%s kubelet-plugin --node-name={node_name} --cdi-dir={cdi_dir} "
              "--plugin-registration-path={plugins_registry} --datadir={kubelet_root}/plugins"
              % (driver, " ".join(driver_flags)))
    work = tempfile.mkdtemp(prefix="dpc.", dir="/tmp")
    s.at_end.append(lambda: shutil.rmtree(work, ignore_errors=True))
    args = [s.args.dpconform, "--dra_driver=" + TEST_DRIVER, "--plugin=" + plugin,
            "--output=json", "--work_dir=" + work, "--quiet"] + list(flags)
    return run_dpconform(s, args, "-".join(["dra"] + [f.strip("-") for f in driver_flags]))


def scenario_dpconform_dra_test_driver(s):
    """dpconform --dra_driver judges a real DRA driver: Kubernetes' own test
    driver passes every DRA scenario (dra-health is n/a: on 1.37 it serves
    the health stream but names no device in it; the scenarios of a device
    plugin beside it are n/a without one) on the oldest and newest DRA releases
    dpconform plays (resource.k8s.io v1beta1 and v1; its ResourceSlices come
    as Kubernetes protobuf, and it follows them with the informer's watch);
    the same driver registering under another name fails dra-registers, and
    the scenarios after it are blocked."""
    rc, report = dpconform_dra_driver(s, [], "--kubelets=1.32,1.37")
    cells = report["cells"]
    want = ["dra-registers", "dra-publishes", "dra-prepare", "dra-several-requests",
            "dra-beside-device-plugin", "dra-device-plugin-beside-claim",
            "dra-kubelet-restart", "dra-driver-restart", "dra-health", "dra-unknown-claim"]
    # n/a: no --resource (no device plugin for the same hardware beside it).
    not_applicable = {"dra-beside-device-plugin", "dra-device-plugin-beside-claim"}
    check(sorted({c["scenario"] for c in cells}) == sorted(want),
          "dpconform ran %s, not %s" % (sorted({c["scenario"] for c in cells}), sorted(want)))
    # dra-health: n/a on 1.32 (no health watched), and on 1.37 the driver
    # serves the stream but names no device in it.
    bad = ["%s on %s: %s %s" % (c["scenario"], c["kubelet"], c["outcome"], c["summary"])
           for c in cells
           if c["outcome"] != ("n/a" if c["scenario"] == "dra-health" or
                               c["scenario"] in not_applicable else "pass")]
    check(not bad and rc == 0, "the test driver did not pass (exit %d):\n%s"
          % (rc, "\n".join(bad)))

    rc, report = dpconform_dra_driver(s, ["--drivername=other.example.com"], "--kubelets=1.37",
                                      "--scenarios=dra-registers,dra-prepare", "--timeout=10s")
    by = {(c["scenario"], c["kubelet"]): c for c in report["cells"]}
    registers = [c for (n, _), c in by.items() if n == "dra-registers"]
    check(rc == 1 and registers and all(c["outcome"] == "fail" for c in registers),
          "a driver registering as other.example.com was not failed on dra-registers "
          "(exit %d): %s" % (rc, registers))
    prepare = [c for (n, _), c in by.items() if n == "dra-prepare"]
    check(prepare and all(c["outcome"] == "blocked" for c in prepare),
          "dra-prepare was not blocked behind the failed registration: %s" % prepare)


def dpconform_real_dra(s, driver, plugin, *flags):
    """dpconform --dra_driver=`driver` on this node's real kubelet, the
    driver's command `plugin`; its exit status and JSON report."""
    check(s.args.dpconform, "--dpconform (the dpconform binary) is not given")
    restart = "%s %s restart-kubelet --dir=%s" % (
        sys.executable, os.path.join(ROOT, "tools", "realnode", "realnode.py"), s.node.dir)
    work = tempfile.mkdtemp(prefix="dpc.", dir="/tmp")
    s.at_end.append(lambda: shutil.rmtree(work, ignore_errors=True))
    args = [s.args.dpconform, "--dra_driver=" + driver,
            "--kubelets=real:%s" % s.node.release.rsplit(".", 1)[0], "--plugin=" + plugin,
            "--restart_kubelet=" + restart, "--kubeconfig=" + s.node.admin_kubeconfig,
            "--pod_image=" + realnode.BUSYBOX_IMAGE, "--timeout=30s", "--output=json",
            "--work_dir=" + work, "--quiet"] + list(flags)
    return run_dpconform(s, args, "-".join(["real-dra", driver] + [
        f.strip("-") for f in flags])[:100])


def scenario_dpconform_real_dra(s):
    """dpconform --dra_driver on the real kubelet: Kubernetes' own DRA test
    driver, registered in the kubelet's plugins_registry and publishing to
    the real API server, passes every DRA scenario a real kubelet can judge
    (claims the real scheduler allocates, prepared for pods the real kubelet
    runs, a kubelet restart and a driver restart), and the report names the
    kubelet's version; the same driver registering under another name fails
    dra-registers, naming what did register, with the rest blocked; and
    dpproxy in DRA mode over a v1beta1 sample plugin that answers CDI names
    without writing their spec fails dra-prepare with the runtime's
    CreateContainerError."""
    binary = s.node.kube_bin("test-driver")
    check(os.access(binary, os.X_OK), "%s is not built (tools/realnode/build)" % binary)

    def test_driver(name, flags=""):
        s.host_paths.append(os.path.join(realnode.KUBELET_ROOT, "plugins", name))
        return ("mkdir -p {kubelet_root}/plugins/%s && exec %s --kubeconfig={kubeconfig} %s "
                "kubelet-plugin --node-name={node_name} --cdi-dir={cdi_dir} "
                "--plugin-registration-path={plugins_registry} --datadir={kubelet_root}/plugins"
                % (name, binary, flags))
    rc, report = dpconform_real_dra(s, TEST_DRIVER, test_driver(TEST_DRIVER))
    cells = _cells(report)
    want = ["dra-registers", "dra-publishes", "dra-prepare", "dra-several-requests",
            "dra-kubelet-restart", "dra-driver-restart"]
    check(sorted(cells) == sorted(want), "dpconform ran %s on the real kubelet, not %s"
          % (sorted(cells), sorted(want)))
    bad = ["%s: %s %s" % (n, c["outcome"], c["summary"]) for n, c in cells.items()
           if c["outcome"] != "pass"]
    check(not bad and rc == 0, "the DRA test driver did not pass on the real kubelet "
          "(exit %d):\n%s" % (rc, "\n".join(bad)))
    version = realnode.run([s.node.kube_bin("kubelet"), "--version"]).split()[-1]
    check(all(c["generation"] == "real kubelet " + version for c in cells.values()),
          "the report does not name the real kubelet %s: %s" % (
              version, sorted({c["generation"] for c in cells.values()})))
    several = cells["dra-several-requests"]
    check(any("r0: " in n and "r1: " in n for n in several.get("notes", [])),
          "dra-several-requests does not name the two requests' devices: %s" % several)

    other = "other.example.com"
    s.at_end.append(lambda: s.node.kubectl("delete", "resourceslices", "--field-selector",
                                           "spec.driver=" + other, "--wait=false",
                                           check=False))
    rc, report = dpconform_real_dra(s, TEST_DRIVER,
                                    test_driver(other, "--drivername=" + other),
                                    "--scenarios=dra-registers,dra-prepare", "--timeout=10s")
    cells = _cells(report)
    registers, prepare = cells.get("dra-registers", {}), cells.get("dra-prepare", {})
    check(rc == 1 and registers.get("outcome") == "fail" and
          "DRAPlugin " + other in registers.get("plugin_did", ""),
          "a driver registering as %s was not failed on dra-registers naming it (exit %d): %s"
          % (other, rc, registers))
    check(prepare.get("outcome") == "blocked",
          "dra-prepare was not blocked behind the failed registration: %s" % prepare)

    s.device_nodes("gpu", DEVICES, prefix="dev")  # the sample plugin's default IDs
    plugin = ("%s --kubelet_api=dra --dra_driver=%s --node_name={node_name} "
              "--kubeconfig={kubeconfig} --cdi_dir={cdi_dir} --kubelet_root={kubelet_root} "
              "--plugin_dir={work_dir}/p --state_dir={work_dir}/s --metrics_address= "
              "2>>{work_dir}/dpproxy.log & exec %s --quiet --api=v1beta1 "
              "--resource=example.com/gpu --devices=%d --kubelet_socket={work_dir}/p/kubelet.sock"
              % (s.args.dpproxy, DRIVER, s.args.sample_plugin, DEVICES))
    rc, report = dpconform_real_dra(s, DRIVER, plugin,
                                    "--scenarios=dra-registers,dra-publishes,dra-prepare")
    cells = _cells(report)
    outcomes = {n: c["outcome"] for n, c in cells.items()}
    check(rc == 1 and outcomes == {"dra-registers": "pass", "dra-publishes": "pass",
                                   "dra-prepare": "fail"} and
          "CreateContainerError" in cells["dra-prepare"]["summary"],
          "dpproxy over a plugin whose CDI names have no spec was not failed on dra-prepare "
          "with CreateContainerError alone (exit %d): %s" % (rc, json.dumps(cells)))


CHART = os.path.join(ROOT, "deploy", "helm", "dpproxy")


def helm(s, *args, timeout=300):
    """Real Helm (tools/realnode/build's) against the node's API server."""
    return realnode.run([s.node.part_bin("helm", "helm"), "--kubeconfig",
                         s.node.admin_kubeconfig] + list(args), timeout=timeout)


def import_image(s):
    """Our image (--image) imported into the node's containerd; returns its
    repository and tag, as the image names itself."""
    check(s.args.image, "--image is not given (the OCI archive tools/image builds)")
    out = s.node.ctr("images", "import", s.args.image)
    m = re.search(r"(localhost/dpproxy):(\S+)", out + "\n" + s.node.ctr("images", "ls", "-q"))
    check(m, "containerd did not name the imported image localhost/dpproxy:<version>:\n" + out)
    return m.group(1), m.group(2)


def chart_pods(s):
    """The DaemonSet's pods, oldest first."""
    pods = s.node.get_json("pods", "-n", "kube-system", "-l",
                           "app.kubernetes.io/name=dpproxy")["items"]
    return sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"])


def _ready(pod):
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod["status"].get("conditions", []))


def _rendered(s, *args, cluster=False):
    """`helm template` of the chart (release dpproxy in kube-system unless
    args say otherwise): (exit status, output and errors). `cluster`: with
    the node's API versions and Helm's own validation against it
    (--validate), as `helm install` renders; else offline, as a GitOps
    pipeline does."""
    extra = ["--validate", "--kubeconfig", s.node.admin_kubeconfig] if cluster else []
    p = subprocess.run([s.node.part_bin("helm", "helm"), "template"] + extra +
                       (list(args) if args and not args[0].startswith("-") else
                        ["dpproxy", CHART, "-n", "kube-system"] + list(args)),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return p.returncode, p.stdout.decode(errors="replace")


def render_ok(s, name, *args, cluster=False):
    """The chart rendered with `args`, saved as <work>/<name>.yaml; fails
    naming Helm's error."""
    rc, out = _rendered(s, *args, cluster=cluster)
    check(rc == 0, "helm template %s: %s" % (" ".join(args), out[-2000:]))
    with open(os.path.join(s.work, name + ".yaml"), "w") as f:
        f.write(out)
    return out


def render_refused(s, needle, *args, cluster=False):
    """The chart refused with `args`, Helm's message naming `needle`."""
    rc, out = _rendered(s, *args, cluster=cluster)
    check(rc != 0, "helm template %s rendered: nothing refused it" % " ".join(args))
    check(needle in out, "helm template %s: the error does not say %r:\n%s"
          % (" ".join(args), needle, out[-2000:]))


def kinds(rendered):
    """kind -> how many the rendered manifests have."""
    n = {}
    for k in re.findall(r"(?m)^kind: (\S+)$", rendered):
        n[k] = n.get(k, 0) + 1
    return n


def server_dry_run(s, name, rendered):
    """The API server's strict validation of the rendered objects
    (apply --dry-run=server --validate=strict), those of the Prometheus
    Operator left out (no CRDs here): (exit status, kubectl's output)."""
    docs = [d for d in rendered.split("\n---\n")
            if not re.search(r"(?m)^kind: (ServiceMonitor|PodMonitor)$", d)]
    path = os.path.join(s.work, name + ".server.yaml")
    with open(path, "w") as f:
        f.write("\n---\n".join(docs))
    p = subprocess.run([s.node.kube_bin("kubectl"), "--kubeconfig", s.node.admin_kubeconfig,
                        "apply", "--dry-run=server", "--validate=strict", "-f", path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return p.returncode, p.stdout.decode(errors="replace")


def server_accepts(s, name, rendered):
    rc, out = server_dry_run(s, name, rendered)
    check(rc == 0, "%s: the API server refused the chart's objects:\n%s" % (name, out[-3000:]))


def chart_config(s, rendered, name):
    """dpproxy.yaml of the rendered ConfigMap `name`, through kubectl."""
    docs = [d for d in rendered.split("\n---\n")
            if re.search(r"(?m)^kind: ConfigMap$", d) and
            re.search(r"(?m)^  name: %s$" % re.escape(name), d)]
    check(len(docs) == 1, "no ConfigMap %s rendered" % name)
    path = os.path.join(s.work, "configmap-%s.yaml" % name)
    with open(path, "w") as f:
        f.write(docs[0])
    return s.node.kubectl("create", "--dry-run=client", "-o",
                          "jsonpath={.data.dpproxy\\.yaml}", "-f", path)


def dpproxy_accepts(s, config, env=None):
    """dpproxy --check of a configuration: what it says it runs with."""
    path = os.path.join(s.work, "chart-config.yaml")
    with open(path, "w") as f:
        f.write(config)
    p = subprocess.run([s.args.dpproxy, "--config=" + path, "--check"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=dict(os.environ, **(env or {})))
    out = p.stdout.decode(errors="replace")
    check(p.returncode == 0, "dpproxy refused the configuration the chart writes:\n%s\n%s"
          % (out, config))
    return out


def scenario_helm_chart_render(s):
    """The chart as real Helm renders it (helm lint --strict, helm template
    with the default values, every `helm install` the docs give, and a
    second values file), each rendering accepted by the real API server's
    strict validation (apply --dry-run=server) and its configuration by
    dpproxy --check; mistakes refused naming them: by the chart's own
    checks, by the values' schema (in Helm's words), by the API server
    (a quantity, a toleration, a misspelt field in a template)."""
    helm(s, "lint", "--strict", CHART)
    with open(os.path.join(CHART, "Chart.yaml")) as f:
        app_version = re.search(r'(?m)^appVersion: "?([^"\n]+)"?$', f.read()).group(1)

    # The default values.
    out = render_ok(s, "default")
    n = kinds(out)
    for k in ("ConfigMap", "DaemonSet", "ServiceAccount"):
        check(n.get(k) == 1, "default: %d %s, not one" % (n.get(k, 0), k))
    for k in ("ClusterRole", "Service", "ServiceMonitor", "PodMonitor", "DeviceClass"):
        check(k not in n, "default: a %s rendered" % k)
    for needle, what in [
            ("priorityClassName: system-node-critical", "the node-critical priority"),
            ('image: "registry.example.com/dpproxy:%s"' % app_version,
             "the image of the chart's appVersion"),
            ("path: /livez", "the liveness probe"), ("path: /readyz", "the readiness probe"),
            ("path: /run/containerd\n", "containerd's directory"),
            ("app.kubernetes.io/managed-by: Helm", "the recommended labels"),
            ("allowPrivilegeEscalation: false", "no escalation"),
            ("readOnlyRootFilesystem: true", "a read-only root"),
            ("maxSurge: 1", "the new pod beside the old"), ("maxUnavailable: 0", "none unavailable"),
            ("- --takeover", "the takeover"), ("- --after_handoff=wait", "the old pod waiting")]:
        check(needle in out, "default: %s (%r) is not in the rendering" % (what, needle))
    server_accepts(s, "default", out)
    said = dpproxy_accepts(s, chart_config(s, out, "dpproxy"))
    for needle in ("plugin_dir: /var/lib/dpproxy/device-plugins",
                   "container_runtime_endpoint: /run/containerd/containerd.sock"):
        check(needle in said, "default: dpproxy --check does not say %r:\n%s" % (needle, said))

    # Every `helm install` the docs give, as written.
    commands = []
    for doc in (os.path.join(ROOT, "docs", "operations.md"), os.path.join(CHART, "README.md")):
        with open(doc) as f:
            text = re.sub(r"\\\n\s*", " ", f.read())
        commands += re.findall(r"(?m)^helm install .*$", text)
    check(len(commands) >= 3, "the docs have %d helm install commands" % len(commands))
    dra_api = s.minor >= 32  # resource.k8s.io v1beta1 from 1.32, v1 from 1.34
    for i, cmd in enumerate(commands):
        sets = []
        for kv in re.findall(r"--set (\S+)", cmd):
            sets += ["--set", kv]
        if "dra.enabled=true" in cmd and not dra_api:
            render_refused(s, "DRA mode needs Kubernetes 1.32 or later", *sets, cluster=True)
            continue
        out = render_ok(s, "docs-%d" % i, *sets, cluster=True)
        server_accepts(s, "docs-%d" % i, out)
        if "dra.enabled=true" in cmd:
            check(kinds(out).get("DeviceClass") == 1 and
                  'device.driver == \\"gpu.vendor.com\\"' in out,
                  "%s: no DeviceClass selecting its driver" % cmd)
            check("- --takeover" in out and "maxSurge: 1" in out,
                  "%s: no upgrade without a gap" % cmd)

    # DRA mode, monitoring, another kubelet root, a release elsewhere.
    s.apply_json({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "node-agents"}})
    values = os.path.join(ROOT, "tests", "deploy", "helm-values-dra.yaml")
    out = render_ok(s, "dra", "gpu", CHART, "-n", "node-agents", "-f", values)
    if dra_api:
        # As `helm install` renders it here (the ServiceMonitor off: no CRD).
        server_accepts(s, "dra-cluster", render_ok(
            s, "dra-cluster", "gpu", CHART, "-n", "node-agents", "-f", values,
            "--set", "metrics.serviceMonitor.enabled=false", cluster=True))
    else:
        render_refused(s, "DRA mode needs Kubernetes 1.32 or later", "gpu", CHART, "-n",
                       "node-agents", "-f", values, cluster=True)
    n = kinds(out)
    for k in ("ClusterRole", "ClusterRoleBinding", "Service", "ServiceMonitor", "DeviceClass"):
        check(n.get(k) == 1, "dra: %d %s, not one" % (n.get(k, 0), k))
    check("PodMonitor" not in n, "dra: a PodMonitor beside the ServiceMonitor")
    for needle in ("name: gpu-dpproxy\n", "serviceAccountName: gpu-bridge",
                   "namespace: node-agents", 'image: "registry.internal:5000/infra/dpproxy:0.7.0-rc1"',
                   "mountPath: /data/kubelet/plugins\n", "mountPath: /var/run/cdi",
                   '- "--v=1"', "cpu: 10m"):
        check(needle in out, "dra: %r is not in the rendering" % needle)
    check("--takeover" not in out, "dra: takeover where the values turn it off")
    said = dpproxy_accepts(s, chart_config(s, out, "gpu-dpproxy"), env={"NODE_NAME": "node-1"})
    for needle in ("api: dra", "driver: gpu.vendor.com", "policy: hold", "root: /data/kubelet"):
        check(needle in said, "dra: dpproxy --check does not say %r:\n%s" % (needle, said))
    dc = ["--set", "dra.enabled=true", "--set", "dra.driver=gpu.vendor.com",
          "--set", "dra.deviceClass.extendedResourceName=vendor.com/gpu"]
    if s.minor >= 34:
        out = render_ok(s, "dc", *dc, cluster=True)
        check('extendedResourceName: "vendor.com/gpu"' in out, "the DeviceClass without the "
              "extended resource asked for")
        server_accepts(s, "dc", out)
    else:
        render_refused(s, "needs Kubernetes 1.3", *dc, cluster=True)
    out = render_ok(s, "nodc", "--set", "dra.enabled=true", "--set", "dra.driver=gpu.vendor.com",
                    "--set", "dra.deviceClass.create=false")
    check("DeviceClass" not in kinds(out), "a DeviceClass where create is false")
    out = render_ok(s, "podmonitor", "--set", "metrics.podMonitor.enabled=true")
    check(kinds(out).get("PodMonitor") == 1 and "ServiceMonitor" not in kinds(out),
          "a PodMonitor alone did not render alone")

    # Mistakes, each named.
    render_refused(s, "needs takeover.enabled", "--set", "takeover.enabled=false")
    render_refused(s, "needs config.kubelet.registration kubelet",
                   "--set", "config.kubelet.registration=plugin-watcher")
    render_refused(s, "dra.driver is required", "--set", "dra.enabled=true")
    render_refused(s, "serviceMonitor and metrics.podMonitor are both enabled",
                   "--set", "metrics.podMonitor.enabled=true",
                   "--set", "metrics.serviceMonitor.enabled=true")
    for needle in ["values don't meet the specifications of the schema(s)",
                   "at '/takeover': additional properties 'enable' not allowed",
                   "at '/logFormat': value must be one of 'text', 'json'",
                   "at '/dra/enabled': got string, want boolean",
                   "at '/metrics/port': maximum"]:
        render_refused(s, needle, "--set", "metrics.port=70000", "--set", "logFormat=xml",
                       "--set", "dra.enabled=yes", "--set", "takeover.enable=true")
    # (The API server names the first mistake of an object it cannot
    # decode: one mistake a rendering.)
    for name, args, needle in [
            ("quantity", ["--set", "resources.requests.memory=lots"],
             "quantities must match the regular expression"),
            ("toleration", ["--set", "tolerations[0].operator=Sometimes"],
             'tolerations[0].operator: Unsupported value: "Sometimes"')]:
        out = render_ok(s, name, *args)
        rc, said = server_dry_run(s, name, out)
        check(rc != 0 and needle in said, "%s: the API server does not refuse %s naming %r:\n%s"
              % (name, " ".join(args), needle, said[-2000:]))
    chart = os.path.join(s.work, "chart")
    shutil.copytree(CHART, chart)
    path = os.path.join(chart, "templates", "daemonset.yaml")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("volumeMounts:", "volumeMount:"))
    rc, rendered = _rendered(s, "dpproxy", chart, "-n", "kube-system")
    check(rc == 0, "the chart with a misspelt field did not render: " + rendered[-1000:])
    rc, said = server_dry_run(s, "typo", rendered)
    check(rc != 0 and 'unknown field "spec.template.spec.containers[0].volumeMount"' in said,
          "a misspelt field in a template is not refused by name:\n%s" % said[-2000:])


def scenario_helm_chart(s):
    """The chart installed with real Helm into the real API server: dpproxy
    runs from our image as a DaemonSet pod (a network and PID namespace of
    its own, the kubelet probing its address), serves the sample plugin's
    resource to a pod, and a rollout to a new image takes over without a
    gap: no pod of a stream fails, the kubelet's healthy count never drops,
    the running pod keeps its container, and the new pod is Ready in the
    old one's place."""
    if not os.access(s.node.kube_bin("kube-controller-manager"), os.X_OK):
        raise NotApplicable("this node has no controller-manager, so no DaemonSet "
                            "controller (tools/realnode/versions.env says why)")
    repo, tag = import_image(s)
    s.node.ctr("images", "tag", "%s:%s" % (repo, tag), "%s:%s-rollout" % (repo, tag))
    host = os.path.join(s.work, "host")

    def save_logs():
        for pod in chart_pods(s):
            name = pod["metadata"]["name"]
            with open(os.path.join(s.work, "pod-%s.log" % name), "w") as f:
                f.write(container_log(pod, "dpproxy"))
        helm(s, "uninstall", "dpproxy", "-n", "kube-system", "--wait", "--timeout", "2m")
    s.at_end.append(save_logs)
    helm(s, "install", "dpproxy", CHART, "-n", "kube-system",
         "--set", "image.repository=" + repo, "--set", "image.tag=" + tag,
         "--set", "image.pullPolicy=Never", "--set", "hostDir=" + host,
         "--set", "containerRuntimeSocket=" + realnode.CONTAINERD_SOCKET,
         "--wait", "--timeout", "3m")
    first = chart_pods(s)
    check(len(first) == 1 and _ready(first[0]), "helm install --wait ended without one Ready "
          "dpproxy pod: %s" % [p["metadata"]["name"] for p in first])
    check(not first[0]["spec"].get("hostNetwork") and first[0]["status"].get("podIP"),
          "the chart's pod is meant to run on the pod network: %s"
          % json.dumps(first[0]["status"].get("podIPs")))
    s.plugin("v1beta1", kubelet_socket=os.path.join(host, "device-plugins", "kubelet.sock"))
    s.wait_allocatable(DEVICES)
    s.pod("p1", 2, SCRIPT)
    s.wait_running("p1")
    held = check_inside(s, "p1", "v1beta1", 2, cdi=True)
    container = s.container_id("p1")
    offset = os.path.getsize(os.path.join(s.node.logs, "kubelet.log"))
    with PodStream(s, "h") as stream:
        wait_until("the first pod of the stream", lambda: stream.ran or stream.failed, 60)
        helm(s, "upgrade", "dpproxy", CHART, "-n", "kube-system", "--reuse-values",
             "--set", "image.tag=%s-rollout" % tag, "--wait", "--timeout", "3m")
        seen = len(stream.ran) + len(stream.failed)
        wait_until("a pod of the stream after the rollout",
                   lambda: len(stream.ran) + len(stream.failed) > seen, 60)
    # helm --wait waits for the new pod to be Ready; the old one (handed
    # over, waiting to be deleted) goes once the DaemonSet deletes it.
    def one_new_pod():
        pods = chart_pods(s)
        done = (len(pods) == 1 and _ready(pods[0]) and
                pods[0]["spec"]["containers"][0]["image"].endswith(":%s-rollout" % tag))
        return pods if done else None
    try:
        pods = wait_until("one Ready pod of the new image, the old one gone", one_new_pod, 60)
    except Failure:
        raise Failure("after the rollout: not one Ready pod of the new image: %s"
                      % [(p["metadata"]["name"], p["spec"]["containers"][0]["image"], _ready(p))
                         for p in chart_pods(s)])
    new_log = container_log(pods[0], "dpproxy")
    check("took over" in new_log or "takeover" in new_log,
          "the new pod's dpproxy did not take over:\n%s" % new_log[-3000:])
    check(not stream.failed, "pods failed during the rollout:\n%s" % "\n".join(stream.failed))
    check(_running_with(s, "p1", container), "p1 did not keep its container")
    check(set(s.devices_of("p1")) == set(held), "p1's devices changed")
    _check_never_unhealthy(s, offset, "the chart's rollout")


# Scenarios that wait out a kubelet's own timers (the 5-minute endpoint
# grace): run by tools/dev e2e, left out of tools/dev test's last phase.
SLOW = {"dra-after-endpoint-grace"}

SCENARIOS = [
    ("registration-kubelet-sock", scenario_registration_kubelet_sock),
    ("registration-plugin-watcher", scenario_registration_plugin_watcher),
    ("v1alpha-plugin", scenario_v1alpha_plugin),
    ("kubelet-restart", scenario_kubelet_restart),
    ("plugin-restart", scenario_plugin_restart),
    ("plugin-options-change", scenario_plugin_options_change),
    ("checkpoint-loss", scenario_checkpoint_loss),
    ("never-started-container", scenario_never_started_container),
    ("takeover-under-pods", scenario_takeover_under_pods),
    ("restarts-after-takeover", scenario_restarts_after_takeover),
    ("takeover-new-dies-registered", scenario_takeover_new_dies_registered),
    ("dra", scenario_dra, 32),
    # Pods of the extended resource through DRA: on by default from 1.36.
    ("move-to-dra", scenario_move_to_dra, 36),
    ("both-one-device-free", scenario_both_one_device_free, 36),
    ("health-in-pod-status", scenario_health_in_pod_status, 36),
    ("cordon-in-pod-status", scenario_cordon_in_pod_status, 36),
    ("silent-plugin", scenario_silent_plugin),
    # Waits out the kubelet's 5-minute endpoint grace.
    ("dra-after-endpoint-grace", scenario_dra_after_endpoint_grace, 36),
    ("k8s-sample-device-plugin", scenario_k8s_sample_device_plugin),
    ("helm-chart-render", scenario_helm_chart_render),
    ("helm-chart", scenario_helm_chart),
    ("pod-resources-real-client", scenario_pod_resources_real_client),
    ("dpconform-real", scenario_dpconform_real),
    # Kubernetes' DRA test driver is built for the newest release only.
    ("dpconform-dra-test-driver", scenario_dpconform_dra_test_driver, 37),
    ("dpconform-real-dra", scenario_dpconform_real_dra, 37),
    # Simulated kubelets only: once, with the newest release's build.
    ("dpconform-k8s-sample-plugin-grid", scenario_dpconform_k8s_sample_grid, 37),
    ("dpproxy-sigkill-own-socket-plugin",
     lambda s: scenario_dpproxy_sigkill(s, "own-socket")),
    ("dpproxy-sigkill-kubelet-socket-plugin",
     lambda s: scenario_dpproxy_sigkill(s, "kubelet-socket")),
]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", default=None)
    ap.add_argument("--dpproxy", required=True)
    ap.add_argument("--sample_plugin", required=True)
    ap.add_argument("--dpctl", required=True)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--image", default="",
                    help="dpproxy's OCI image (tools/image); the helm-chart scenario needs it")
    ap.add_argument("--dpconform", default="",
                    help="dpconform (tools/conform); the dpconform-* scenarios need it")
    ap.add_argument("--scenarios", default="")
    ap.add_argument("--skip_slow", action="store_true",
                    help="leave out the scenarios that wait out a kubelet's own timers "
                         "(SLOW): the last phase of tools/dev test does")
    ap.add_argument("--node_dir", default=realnode.DEFAULT_DIR)
    ap.add_argument("--keep_logs", action="store_true",
                    help="keep every scenario's logs, not only a failed one's")
    args = ap.parse_args(argv)
    wanted = [e[0] for e in SCENARIOS if not (args.skip_slow and e[0] in SLOW)]
    if args.scenarios:
        wanted = args.scenarios.split(",")
        unknown = set(wanted) - {e[0] for e in SCENARIOS}
        if unknown:
            print("e2e: unknown scenarios: %s" % ", ".join(sorted(unknown)), file=sys.stderr)
            return 2
    node = realnode.Node(args.node_dir, args.release)
    passed = failed = 0
    try:
        try:
            node.up()
        except realnode.NodeError as e:
            for n in wanted:
                print("FAILED %s %s: the node did not come up: %s" % (
                    args.release or "newest", n, e), flush=True)
            return 1
        print("e2e: on Kubernetes %s (the kubelet says %s)" % (
            node.release, realnode.run([node.kube_bin("kubelet"), "--version"]).strip()),
            flush=True)
        for entry in SCENARIOS:
            name, fn = entry[0], entry[1]
            if name not in wanted:
                continue
            if len(entry) > 2 and realnode.minor_of(node.release) < entry[2]:
                print("N/A %s %s: needs Kubernetes 1.%d or later" % (node.release, name, entry[2]),
                      flush=True)
                continue
            s = Scenario(node, args, name)
            t0 = time.monotonic()
            ok, why = True, ""
            na = None
            try:
                fn(s)
            except NotApplicable as e:
                na = str(e)
            except Failure as e:
                ok, why = False, str(e)
            except Exception as e:  # noqa: BLE001 - reported as the scenario's failure
                ok, why = False, "%s\n%s" % (e, traceback.format_exc())
            s.finish(not ok or args.keep_logs, args.logs)
            if na is not None:
                print("N/A %s %s: %s" % (node.release, name, na), flush=True)
            elif ok:
                passed += 1
                print("PASSED %s %s (%.0f s)" % (node.release, name, time.monotonic() - t0),
                      flush=True)
            else:
                failed += 1
                print("FAILED %s %s: %s\n  logs: %s" % (
                    node.release, name, why, os.path.join(args.logs, node.release, name)),
                    flush=True)
    finally:
        try:
            node.down()
        except realnode.NodeError as e:
            print("FAILED %s teardown: %s" % (node.release, e), flush=True)
            failed += 1
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
