#!/usr/bin/env python3
"""A real single-node Kubernetes cluster on this machine, on loopback only.

    realnode.py up   [--release=1.37] [--dir=DIR]   start it (built by tools/realnode/build)
    realnode.py down [--dir=DIR]                    stop it and remove everything it made
    realnode.py kubectl [--dir=DIR] ARGS...         kubectl against it
    realnode.py restart-kubelet [--dir=DIR]         stop the kubelet (SIGTERM), start it
                                                    again, and end once it is healthy

The parts: etcd; the API server with a PKI made at start; the scheduler and the
controller-manager; containerd with runc and the CNI plugins; the kubelet.
Images are built here (busybox from Debian's busybox-static, and a pause image
of our own) and imported into containerd: nothing is pulled. Pods use the host
network, or a host-only bridge (POD_BRIDGE, POD_SUBNET) that nothing outside
this machine reaches: the node adds the bridge with the gateway's address, and
CNI's bridge plugin only attaches pods to it (no forwarding, no masquerade, no
firewall rule), so the kubelet reaches a pod's own address as on any node.

The kubelet keeps its device-plugin sockets under /var/lib/kubelet whatever
its root directory is, and containerd its shim sockets under /run/containerd,
so the node uses those paths and refuses to start while either exists and is
not its own. Everything else lives in DIR. `down` stops every process the node
started (containers included), unmounts what it mounted, removes its cgroups,
and removes DIR and every other path it created.

Needs root. Any part that cannot be started ends `up` with an error naming the
part and the reason, after tearing down what was started.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = "/var/tmp/dpproxy-realnode"
NODE_NAME = "realnode"
MARKER = ".dpproxy-realnode"
KUBELET_ROOT = "/var/lib/kubelet"
CONTAINERD_STATE = "/run/containerd"
CONTAINERD_SOCKET = CONTAINERD_STATE + "/containerd.sock"
# Paths outside DIR the node may create; `down` removes those it created.
OUTSIDE_PATHS = [KUBELET_ROOT, CONTAINERD_STATE, "/var/log/pods", "/var/log/containers",
                 "/etc/cdi", "/var/run/cdi",
                 # libcni's cache of each pod's network result (not configurable)
                 "/var/lib/cni"]
# Below the kernel's ephemeral range (32768 on), so that no outgoing
# connection holds one of them when its part starts.
PORTS = {"etcd": 12379, "etcd_peer": 12380, "apiserver": 16443, "kubelet": 11250,
         "kubelet_healthz": 11248, "scheduler": 11259, "controller_manager": 11257}
# The pods' network: a bridge only this machine is on.
POD_BRIDGE = "dpprn0"
POD_SUBNET = "10.251.0.0/24"
POD_GATEWAY = "10.251.0.1"
BUSYBOX_IMAGE = "registry.invalid/realnode/busybox:1"
PAUSE_IMAGE = "registry.invalid/realnode/pause:1"


class NodeError(Exception):
    """A part of the node could not be built, started or stopped."""


def log(msg):
    print("realnode: " + msg, file=sys.stderr, flush=True)


def read_versions():
    versions = {}
    with open(os.path.join(HERE, "versions.env")) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                versions[key] = value.strip('"')
    return versions


def release_of(want, versions):
    releases = versions["KUBERNETES_RELEASES"].split()
    if not want:
        return releases[0]
    for r in releases:
        if r == want or r.rsplit(".", 1)[0] == want:
            return r
    raise NodeError("kubernetes %s: not pinned in tools/realnode/versions.env (pinned: %s)"
                    % (want, " ".join(releases)))


def minor_of(release):
    return int(release.split(".")[1])


def cache_dir():
    return os.environ.get("DPPROXY_REALNODE_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "dpproxy-realnode"))


def bin_dir(part, version):
    return os.path.join(cache_dir(), "bin", "%s-%s" % (part, version))


def run(args, **kw):
    """Runs a command; a failure is a NodeError with its output."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.STDOUT)
    p = subprocess.run(args, **kw)
    if p.returncode != 0:
        out = p.stdout.decode(errors="replace") if p.stdout else ""
        raise NodeError("%s exited with %d: %s" % (os.path.basename(args[0]), p.returncode,
                                                  out.strip()[-2000:]))
    return p.stdout.decode(errors="replace") if p.stdout else ""


def wait_for(what, check, timeout, proc=None, log_path=None):
    """Polls check() until it is true; fails naming `what` at the deadline
    or as soon as proc (the part's process) has exited."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise NodeError("%s exited with %d while starting%s" % (
                what, proc.returncode, tail_of(log_path)))
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 - the last error is reported
            last = e
        time.sleep(0.2)
    raise NodeError("%s not ready after %d s%s%s" % (
        what, timeout, (": %s" % last) if last else "", tail_of(log_path)))


def tail_of(path, lines=15):
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        text = f.read().splitlines()[-lines:]
    return "\n  last lines of %s:\n    %s" % (path, "\n    ".join(text))


def port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


# ---------------------------------------------------------------- PKI

def make_pki(pki):
    os.makedirs(pki, exist_ok=True)

    def openssl(*args):
        run(["openssl"] + list(args), cwd=pki)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.crt", "-days", "2", "-subj", "/CN=realnode-ca")

    def cert(name, subject, sans=None):
        ext = os.path.join(pki, name + ".ext")
        with open(ext, "w") as f:
            f.write("basicConstraints=CA:FALSE\n")
            f.write("keyUsage=digitalSignature,keyEncipherment\n")
            f.write("extendedKeyUsage=serverAuth,clientAuth\n")
            if sans:
                f.write("subjectAltName=" + ",".join(sans) + "\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
                name + ".csr", "-subj", subject)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", name + ".crt", "-days", "2", "-extfile", ext)

    cert("apiserver", "/CN=kube-apiserver",
         ["IP:127.0.0.1", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes",
          "DNS:kubernetes.default", "DNS:kubernetes.default.svc"])
    cert("admin", "/O=system:masters/CN=realnode-admin")
    cert("kubelet", "/O=system:nodes/CN=system:node:" + NODE_NAME,
         ["IP:127.0.0.1", "DNS:localhost", "DNS:" + NODE_NAME])
    cert("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client")
    openssl("genrsa", "-out", "sa.key", "2048")
    openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")


def kubeconfig(path, pki, user):
    server = "https://127.0.0.1:%d" % PORTS["apiserver"]
    with open(path, "w") as f:
        f.write("""apiVersion: v1
kind: Config
clusters:
- name: realnode
  cluster:
    server: {server}
    certificate-authority: {pki}/ca.crt
users:
- name: {user}
  user:
    client-certificate: {pki}/{user}.crt
    client-key: {pki}/{user}.key
contexts:
- name: realnode
  context: {{cluster: realnode, user: {user}}}
current-context: realnode
""".format(server=server, pki=pki, user=user))


# ---------------------------------------------------------------- images

def _tar_add(tar, name, data=None, mode=0o644, kind=tarfile.REGTYPE, link=""):
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.mtime = 0
    info.type = kind
    info.linkname = link
    if data is not None:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def oci_archive(path, name, files, entrypoint):
    """Writes an OCI image-layout tarball `path` of one layer made of
    `files` (list of (name, data|None for a dir, mode, symlink target))."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for fname, data, mode, link in files:
            if link:
                _tar_add(t, fname, mode=0o777, kind=tarfile.SYMTYPE, link=link)
            elif data is None:
                _tar_add(t, fname, mode=mode, kind=tarfile.DIRTYPE)
            else:
                _tar_add(t, fname, data=data, mode=mode)
    layer = layer_buf.getvalue()
    layer_gz = gzip.compress(layer, mtime=0)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }, sort_keys=True).encode()

    def desc(media, blob):
        return {"mediaType": media, "digest": "sha256:" + hashlib.sha256(blob).hexdigest(),
                "size": len(blob)}

    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": desc("application/vnd.oci.image.config.v1+json", config),
        "layers": [desc("application/vnd.oci.image.layer.v1.tar+gzip", layer_gz)],
    }, sort_keys=True).encode()
    mdesc = desc("application/vnd.oci.image.manifest.v1+json", manifest)
    mdesc["annotations"] = {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}
    mdesc["platform"] = {"architecture": "amd64", "os": "linux"}
    index = json.dumps({"schemaVersion": 2, "manifests": [mdesc]}, sort_keys=True).encode()
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        _tar_add(t, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _tar_add(t, "index.json", index)
        _tar_add(t, "blobs", mode=0o755, kind=tarfile.DIRTYPE)
        _tar_add(t, "blobs/sha256", mode=0o755, kind=tarfile.DIRTYPE)
        for blob in (config, manifest, layer_gz):
            _tar_add(t, "blobs/sha256/" + hashlib.sha256(blob).hexdigest(), blob)


def build_images(work):
    """The busybox and pause images, as OCI archives in `work`."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        raise NodeError("busybox image: Debian's busybox-static is not installed "
                        "(tools/realnode/setup installs it)")
    with open(busybox, "rb") as f:
        bb = f.read()
    applets = run([busybox, "--list"]).split()
    files = [("bin", None, 0o755, ""), ("bin/busybox", bb, 0o755, ""),
             ("tmp", None, 0o1777, ""), ("etc", None, 0o755, ""),
             ("etc/passwd", b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n",
              0o644, "")]
    files += [("bin/" + a, None, 0, "busybox") for a in applets if a != "busybox"]
    oci_archive(os.path.join(work, "busybox.tar"), BUSYBOX_IMAGE, files, ["/bin/sh"])

    pause_bin = os.path.join(work, "pause")
    run(["gcc", "-static", "-O2", "-o", pause_bin, os.path.join(HERE, "pause.c")])
    run(["strip", pause_bin])
    with open(pause_bin, "rb") as f:
        pause = f.read()
    oci_archive(os.path.join(work, "pause.tar"), PAUSE_IMAGE, [("pause", pause, 0o755, "")],
                ["/pause"])


# ---------------------------------------------------------------- the node

class Node:
    def __init__(self, workdir, release=None):
        self.dir = os.path.abspath(workdir)
        self.versions = read_versions()
        self.release = release
        self.pki = os.path.join(self.dir, "pki")
        self.logs = os.path.join(self.dir, "logs")
        self.admin_kubeconfig = os.path.join(self.dir, "admin.kubeconfig")

    # -- paths and state

    def _state_path(self):
        return os.path.join(self.dir, "node.json")

    def _load_state(self):
        try:
            with open(self._state_path()) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def _save_state(self, state):
        tmp = self._state_path() + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, self._state_path())

    def kube_bin(self, name):
        return os.path.join(bin_dir("kubernetes", self.release), name)

    def part_bin(self, part, name):
        key = {"containerd": "CONTAINERD_VERSION", "runc": "RUNC_VERSION",
               "cni": "CNI_PLUGINS_VERSION", "etcd": "ETCD_VERSION",
               "helm": "HELM_VERSION", "podresources": "PODRESOURCES_API_VERSION"}[part]
        return os.path.join(bin_dir(part, self.versions[key]), name)

    def kubectl(self, *args, check=True, timeout=60, input=None):
        p = subprocess.run([self.kube_bin("kubectl"), "--kubeconfig", self.admin_kubeconfig]
                           + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout, input=input)
        if check and p.returncode != 0:
            raise NodeError("kubectl %s: %s" % (" ".join(args), p.stderr.decode().strip()))
        return p.stdout.decode()

    def get_json(self, *args):
        return json.loads(self.kubectl("get", "-o", "json", *args))

    # -- processes

    def _start(self, name, args, env=None):
        os.makedirs(self.logs, exist_ok=True)
        log_path = os.path.join(self.logs, name + ".log")
        out = open(log_path, "ab")
        full_env = dict(os.environ)
        full_env.update(env or {})
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True)
        out.close()
        state = self._load_state()
        state["pids"][name] = proc.pid
        self._save_state(state)
        return proc, log_path

    def stop_process(self, name, sig=signal.SIGTERM, timeout=20):
        state = self._load_state()
        pid = state["pids"].get(name) if state else None
        if not pid:
            return
        kill_and_wait(pid, sig, timeout)
        state["pids"].pop(name, None)
        self._save_state(state)

    # -- up

    def up(self):
        if os.geteuid() != 0:
            raise NodeError("the real node needs root (it runs containerd and the kubelet)")
        self.release = release_of(self.release, self.versions)
        for part, path in [("kubernetes %s" % self.release, self.kube_bin("kubelet")),
                           ("containerd", self.part_bin("containerd", "containerd")),
                           ("runc", self.part_bin("runc", "runc")),
                           ("cni", self.part_bin("cni", "loopback")),
                           ("cni", self.part_bin("cni", "bridge")),
                           ("cni", self.part_bin("cni", "host-local")),
                           ("etcd", self.part_bin("etcd", "etcd"))]:
            if not os.access(path, os.X_OK):
                raise NodeError("%s: not built (%s missing; run tools/realnode/build)" % (part, path))
        if os.path.exists(os.path.join(self.dir, "node.json")):
            raise NodeError("a node is already up in %s (realnode.py down --dir=%s)"
                            % (self.dir, self.dir))
        for path in (KUBELET_ROOT, CONTAINERD_STATE):
            if os.path.exists(path):
                raise NodeError("%s exists and is not this node's: another kubelet or "
                                "containerd may be running here" % path)
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
        for name, port in PORTS.items():
            if port >= low:
                raise NodeError("%s: port %d is in this machine's ephemeral port range "
                                "(from %d: /proc/sys/net/ipv4/ip_local_port_range)"
                                % (name, port, low))
            if not port_free(port):
                raise NodeError("%s: port 127.0.0.1:%d is taken" % (name, port))
        if os.path.exists("/sys/class/net/" + POD_BRIDGE):
            raise NodeError("pod network: the interface %s exists and is not this node's"
                            % POD_BRIDGE)
        routes = run(["ip", "-4", "route", "show", "match", POD_SUBNET]).split("\n")
        taken = [r for r in routes if r.strip() and not r.startswith("default")]
        if taken:
            raise NodeError("pod network: %s is routed on this machine already (%s)"
                            % (POD_SUBNET, taken[0].strip()))
        os.makedirs(self.dir, exist_ok=True)
        created = [p for p in OUTSIDE_PATHS if not os.path.exists(p)]
        self._save_state({"release": self.release, "pids": {}, "created": created})
        try:
            self._up()
        except BaseException:
            log("start failed; tearing down what was started")
            try:
                self.down(keep_logs_in=os.environ.get("REALNODE_KEEP_LOGS"))
            except NodeError as e:
                log("tear-down after the failed start: %s" % e)
            raise

    def _up(self):
        t0 = time.monotonic()
        make_pki(self.pki)
        kubeconfig(self.admin_kubeconfig, self.pki, "admin")
        kubeconfig(os.path.join(self.dir, "kubelet.kubeconfig"), self.pki, "kubelet")

        # etcd
        etcd, etcd_log = self._start("etcd", [
            self.part_bin("etcd", "etcd"), "--name=realnode",
            "--data-dir=" + os.path.join(self.dir, "etcd"),
            "--listen-client-urls=http://127.0.0.1:%d" % PORTS["etcd"],
            "--advertise-client-urls=http://127.0.0.1:%d" % PORTS["etcd"],
            "--listen-peer-urls=http://127.0.0.1:%d" % PORTS["etcd_peer"],
            "--initial-advertise-peer-urls=http://127.0.0.1:%d" % PORTS["etcd_peer"],
            "--initial-cluster=realnode=http://127.0.0.1:%d" % PORTS["etcd_peer"],
            "--log-level=warn"])
        wait_for("etcd", lambda: _http_ok("http://127.0.0.1:%d/health" % PORTS["etcd"]),
                 60, etcd, etcd_log)

        # API server
        p = self.pki
        apiserver, api_log = self._start("kube-apiserver", [
            self.kube_bin("kube-apiserver"),
            "--etcd-servers=http://127.0.0.1:%d" % PORTS["etcd"],
            "--bind-address=127.0.0.1", "--secure-port=%d" % PORTS["apiserver"],
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            "--tls-cert-file=%s/apiserver.crt" % p, "--tls-private-key-file=%s/apiserver.key" % p,
            "--client-ca-file=%s/ca.crt" % p,
            "--service-account-key-file=%s/sa.pub" % p,
            "--service-account-signing-key-file=%s/sa.key" % p,
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            "--kubelet-client-certificate=%s/apiserver-kubelet-client.crt" % p,
            "--kubelet-client-key=%s/apiserver-kubelet-client.key" % p,
            "--profiling=false", "--v=1"] + self._apiserver_release_flags())
        wait_for("kube-apiserver", lambda: self._api_ready(), 120, apiserver, api_log)

        common = ["--kubeconfig=" + self.admin_kubeconfig,
                  "--authentication-kubeconfig=" + self.admin_kubeconfig,
                  "--authorization-kubeconfig=" + self.admin_kubeconfig,
                  "--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false"]
        if os.access(self.kube_bin("kube-controller-manager"), os.X_OK):
            self._start("kube-controller-manager", [
                self.kube_bin("kube-controller-manager")] + common + [
                "--secure-port=%d" % PORTS["controller_manager"],
                "--service-account-private-key-file=%s/sa.key" % p,
                "--root-ca-file=%s/ca.crt" % p,
                "--use-service-account-credentials=false", "--v=1"] +
                self._feature_gate_flags())
        else:
            # A release built without it (versions.env says why): the pods'
            # service account is what the node needs of it.
            log("kubernetes %s has no controller-manager; creating the default service "
                "account by hand" % self.release)
            wait_for("the default namespace", lambda: self.kubectl(
                "get", "namespace", "default", check=False, timeout=10).strip(), 60)
            self.kubectl("create", "serviceaccount", "default", "-n", "default")
        self._start("kube-scheduler", [self.kube_bin("kube-scheduler")] + common + [
            "--secure-port=%d" % PORTS["scheduler"], "--v=1"] + self._feature_gate_flags())

        # The pods' bridge, then containerd with our images.
        self._pod_bridge_up()
        build_images(self.dir)
        cfg = self._containerd_config()
        containerd_path = os.pathsep.join([os.path.dirname(self.part_bin("containerd", "ctr")),
                                           os.path.dirname(self.part_bin("runc", "runc")),
                                           os.environ.get("PATH", "/usr/bin:/bin")])
        ctrd, ctrd_log = self._start("containerd", [
            self.part_bin("containerd", "containerd"), "--config", cfg],
            env={"PATH": containerd_path})
        wait_for("containerd", lambda: os.path.exists(CONTAINERD_SOCKET) and self.ctr("version"),
                 60, ctrd, ctrd_log)
        for image in ("pause.tar", "busybox.tar"):
            try:
                self.ctr("images", "import", os.path.join(self.dir, image))
            except NodeError as e:
                raise NodeError("containerd: importing %s: %s" % (image, e))

        # kubelet
        self.start_kubelet()
        wait_for("the node %s Ready" % NODE_NAME, self._node_ready, 180)
        log("kubernetes %s up in %.0f s (kubeconfig %s)" % (
            self.server_version(), time.monotonic() - t0, self.admin_kubeconfig))

    def _feature_gate_flags(self):
        gates = self._feature_gates()
        if not gates:
            return []
        return ["--feature-gates=" + ",".join("%s=%s" % (k, str(v).lower())
                                              for k, v in sorted(gates.items()))]

    def _feature_gates(self):
        # DRA is on by default from 1.34; on 1.32 and 1.33 it is a beta
        # that is off. dpproxy's DRA mode needs 1.32 or later.
        if minor_of(self.release) in (32, 33):
            return {"DynamicResourceAllocation": True}
        return {}

    def _apiserver_release_flags(self):
        flags = self._feature_gate_flags()
        if minor_of(self.release) in (32, 33):
            flags.append("--runtime-config=resource.k8s.io/v1beta1=true")
        return flags

    def _api_ready(self):
        return self.kubectl("get", "--raw", "/readyz", check=False, timeout=10).strip() == "ok"

    def server_version(self):
        v = json.loads(self.kubectl("get", "--raw", "/version"))
        return v["gitVersion"]

    def ctr(self, *args):
        return run([self.part_bin("containerd", "ctr"), "--address", CONTAINERD_SOCKET,
                    "--namespace", "k8s.io"] + list(args))

    def _pod_bridge_up(self):
        state = self._load_state()
        state["bridge"] = POD_BRIDGE
        self._save_state(state)
        try:
            run(["ip", "link", "add", POD_BRIDGE, "type", "bridge"])
            run(["ip", "addr", "add", POD_GATEWAY + "/" + POD_SUBNET.split("/")[1],
                 "dev", POD_BRIDGE])
            run(["ip", "link", "set", POD_BRIDGE, "up"])
        except NodeError as e:
            raise NodeError("pod network: cannot add the bridge %s: %s" % (POD_BRIDGE, e))

    def _containerd_config(self):
        c = os.path.join(self.dir, "containerd")
        os.makedirs(os.path.join(self.dir, "cni", "net.d"), exist_ok=True)
        # containerd adds the loopback interface itself; this is the pods'
        # network. The bridge exists with its address: the plugin attaches
        # veths to it and touches nothing else of the host.
        with open(os.path.join(self.dir, "cni", "net.d", "10-realnode.conflist"), "w") as f:
            json.dump({"cniVersion": "1.0.0", "name": "realnode-pods", "plugins": [{
                "type": "bridge", "bridge": POD_BRIDGE, "isGateway": False,
                "ipMasq": False, "hairpinMode": False,
                "ipam": {"type": "host-local", "ranges": [[{
                    "subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                    "dataDir": os.path.join(self.dir, "cni", "ipam")}}]}, f)
        cfg = os.path.join(self.dir, "containerd.toml")
        with open(cfg, "w") as f:
            f.write("""version = 3
root = "{c}/root"
state = "{state}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "{c}/opt"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  # The pods' network namespaces under containerd's state, which `down`
  # unmounts and removes, not under /var/run/netns.
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  # This machine lacks CAP_SYS_RESOURCE: containers may only raise their
  # OOM score.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
""".format(c=c, state=CONTAINERD_STATE, sock=CONTAINERD_SOCKET, pause=PAUSE_IMAGE,
           runc=self.part_bin("runc", "runc"),
           cni_bin=os.path.dirname(self.part_bin("cni", "loopback")),
           cni_conf=os.path.join(self.dir, "cni", "net.d")))
        return cfg

    def _kubelet_config(self):
        minor = minor_of(self.release)
        lines = [
            "apiVersion: kubelet.config.k8s.io/v1beta1",
            "kind: KubeletConfiguration",
            "address: 127.0.0.1",
            "port: %d" % PORTS["kubelet"],
            "readOnlyPort: 0",
            "healthzBindAddress: 127.0.0.1",
            "healthzPort: %d" % PORTS["kubelet_healthz"],
            "authentication:",
            "  anonymous: {enabled: false}",
            "  webhook: {enabled: true}",
            "  x509: {clientCAFile: %s/ca.crt}" % self.pki,
            "authorization: {mode: Webhook}",
            "cgroupDriver: cgroupfs",
            "failSwapOn: false",
            "resolvConf: /etc/resolv.conf",
            "tlsCertFile: %s/kubelet.crt" % self.pki,
            "tlsPrivateKeyFile: %s/kubelet.key" % self.pki,
            # A test machine's disk may be nearly full: never evict for it.
            "evictionHard: {memory.available: 1Mi, nodefs.available: '0%', "
            "imagefs.available: '0%', nodefs.inodesFree: '0%'}",
            "imageGCHighThresholdPercent: 100",
            "imageGCLowThresholdPercent: 99",
            # The node's status (its allocatable devices) reaches the API
            # server within a second of a change, not ten: the scenarios
            # wait for it. Unchanged status is still reported once a minute.
            "nodeStatusUpdateFrequency: 1s",
            "nodeStatusReportFrequency: 1m",
        ]
        if minor >= 27:
            lines.append("containerRuntimeEndpoint: unix://" + CONTAINERD_SOCKET)
        if minor >= 31:
            # These machines run cgroup v1.
            lines.append("failCgroupV1: false")
        gates = self._feature_gates()
        if gates:
            lines.append("featureGates:")
            lines += ["  %s: %s" % (k, str(v).lower()) for k, v in sorted(gates.items())]
        path = os.path.join(self.dir, "kubelet.yaml")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def start_kubelet(self):
        args = [self.kube_bin("kubelet"), "--config=" + self._kubelet_config(),
                "--kubeconfig=" + os.path.join(self.dir, "kubelet.kubeconfig"),
                "--hostname-override=" + NODE_NAME, "--root-dir=" + KUBELET_ROOT, "--v=4"]
        if minor_of(self.release) < 27:
            args += ["--container-runtime-endpoint=unix://" + CONTAINERD_SOCKET]
        proc, log_path = self._start("kubelet", args)
        wait_for("kubelet", lambda: _http_ok("http://127.0.0.1:%d/healthz"
                                             % PORTS["kubelet_healthz"]),
                 90, proc, log_path)
        return proc

    def restart_kubelet(self, sig=signal.SIGTERM):
        self.stop_process("kubelet", sig)
        return self.start_kubelet()

    def _node_ready(self):
        node = self.get_json("node", NODE_NAME)
        for c in node["status"].get("conditions", []):
            if c["type"] == "Ready":
                return c["status"] == "True"
        return False

    # -- down

    def down(self, keep_logs_in=None):
        state = self._load_state()
        if state is None:
            if os.path.exists(self.dir):
                raise NodeError("%s has no node.json: not a node directory, left alone" % self.dir)
            return
        self.release = state["release"]
        problems = []
        # The kubelet first, so that it restarts nothing.
        for name in ("kubelet", "kube-scheduler", "kube-controller-manager"):
            pid = state["pids"].get(name)
            if pid:
                kill_and_wait(pid, signal.SIGTERM, 20)
        # Every container, then the shims, then containerd.
        runc = self.part_bin("runc", "runc")
        runc_root = os.path.join(CONTAINERD_STATE, "runc", "k8s.io")
        if os.path.isdir(runc_root) and os.access(runc, os.X_OK):
            try:
                listed = json.loads(run([runc, "--root", runc_root, "list", "--format", "json"])
                                    or "[]") or []
            except (NodeError, ValueError) as e:
                problems.append("runc list: %s" % e)
                listed = []
            for c in listed:
                subprocess.run([runc, "--root", runc_root, "kill", c["id"], "KILL"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                subprocess.run([runc, "--root", runc_root, "delete", "--force", c["id"]],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shim = self.part_bin("containerd", "containerd-shim-runc-v2")
        for pid in pids_of_exe(shim):
            kill_and_wait(pid, signal.SIGKILL, 10)
        for name in ("containerd", "kube-apiserver", "etcd"):
            pid = state["pids"].get(name)
            if pid:
                kill_and_wait(pid, signal.SIGTERM, 20)
        # Whatever else still runs from our binaries (a part that forked).
        for d in [bin_dir("kubernetes", self.release)] + [
                os.path.dirname(self.part_bin(p, "x"))
                for p in ("containerd", "runc", "cni", "etcd")]:
            for pid in _pids_under(d):
                kill_and_wait(pid, signal.SIGKILL, 10)
        # Mounts under the node's paths, deepest first.
        roots = [self.dir, KUBELET_ROOT, CONTAINERD_STATE]
        for mnt in sorted(_mounts_under(roots), key=len, reverse=True):
            if subprocess.run(["umount", mnt], stderr=subprocess.DEVNULL).returncode != 0:
                if subprocess.run(["umount", "-l", mnt]).returncode != 0:
                    problems.append("could not unmount %s" % mnt)
        # The pods' bridge (their veths went with their network namespaces).
        if state.get("bridge") and os.path.exists("/sys/class/net/" + state["bridge"]):
            if subprocess.run(["ip", "link", "del", state["bridge"]]).returncode != 0:
                problems.append("could not remove the bridge %s" % state["bridge"])
        # The pods' cgroups.
        for cg in _kubepods_cgroups():
            try:
                os.rmdir(cg)
            except OSError as e:
                problems.append("cgroup %s: %s" % (cg, e))
        if keep_logs_in:
            os.makedirs(keep_logs_in, exist_ok=True)
            for src in (self.logs, "/var/log/pods"):
                if os.path.isdir(src):
                    shutil.copytree(src, os.path.join(keep_logs_in, os.path.basename(src)),
                                    dirs_exist_ok=True, symlinks=True)
        for path in state.get("created", []):
            shutil.rmtree(path, ignore_errors=True)
            if os.path.lexists(path):
                problems.append("could not remove %s" % path)
        shutil.rmtree(self.dir, ignore_errors=True)
        if os.path.exists(self.dir):
            problems.append("could not remove %s" % self.dir)
        if problems:
            raise NodeError("tear-down left things behind: " + "; ".join(problems))


def _http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def kill_and_wait(pid, sig, timeout):
    """Signals a process (and its session) and waits for it to go; SIGKILL
    at the deadline."""
    for s in (sig, signal.SIGKILL):
        try:
            os.kill(pid, s)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG) != (0, 0):
                    return
            except ChildProcessError:
                pass
            if not _pid_alive(pid):
                return
            time.sleep(0.05)
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _exe_of(pid):
    try:
        return os.readlink("/proc/%s/exe" % pid)
    except OSError:
        return ""


def pids_of_exe(path):
    real = os.path.realpath(path)
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _exe_of(p) == real]


def _pids_under(directory):
    real = os.path.realpath(directory) + "/"
    return [int(p) for p in os.listdir("/proc")
            if p.isdigit() and _exe_of(p).startswith(real) and int(p) != os.getpid()]


def _mounts_under(roots):
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            mnt = line.split()[1].replace("\\040", " ")
            for r in roots:
                if mnt == r or mnt.startswith(r.rstrip("/") + "/"):
                    found.append(mnt)
    return found


def _kubepods_cgroups():
    """Every kubepods cgroup directory, deepest first."""
    found = []
    base = "/sys/fs/cgroup"
    for controller in os.listdir(base):
        top = os.path.join(base, controller, "kubepods")
        if os.path.isdir(top):
            for dirpath, _, _ in os.walk(top):
                found.append(dirpath)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("command", choices=["up", "down", "kubectl", "restart-kubelet"])
    ap.add_argument("--release", default=None, help="Kubernetes release (default: newest pinned)")
    ap.add_argument("--dir", default=DEFAULT_DIR, help="the node's directory (default %(default)s)")
    args, rest = ap.parse_known_args(argv)
    node = Node(args.dir, args.release)
    try:
        if args.command == "up":
            node.up()
        elif args.command == "down":
            node.down()
        elif args.command == "restart-kubelet":
            state = node._load_state()
            if not state:
                raise NodeError("no node is up in %s" % args.dir)
            node.release = state["release"]
            node.restart_kubelet()
        else:
            state = node._load_state()
            if not state:
                raise NodeError("no node is up in %s" % args.dir)
            node.release = state["release"]
            sys.stdout.write(node.kubectl(*rest))
    except NodeError as e:
        print("realnode: error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
