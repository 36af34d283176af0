#!/usr/bin/env python3
"""dpconform's own flakiness, measured: whole grids (--kubelets=all) run
again and again against our sample plugin and, where it is built and this
runs as root, Kubernetes' e2e sample device plugin (a third-party plugin
built from its module by tools/realnode/build), until at least --cells
cells ran. A cell is flaky when its verdict (pass, fail, blocked, n/a)
differs between runs of the same plugin; each flaky cell is printed with
its verdicts per run and the directory of each run's cell (the plugin's
output, the kubelet's events). dpconform's inputs hold no randomness: a
run is named by its number, and its cells' directories are its record.

    tools/bench/conform_flakes.py --dpconform=BIN --sample_plugin=BIN
        [--k8s_sample_plugin=BIN] [--cells=1000] [--jobs=4] [--work=DIR]

A benchmark that prints figures; it asserts nothing and has no time limit.
"""

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sample_plugin_run(sp):
    flags = ("--quiet --resource=example.com/gpu --control_socket={work_dir}/control.sock "
             "--kubelet_socket={kubelet_socket} --preferred --pre_start_required")
    return {
        "name": "sample_plugin",
        "args": ["--resource=example.com/gpu", "--plugin=%s %s" % (sp, flags),
                 "--health_command=%s set-health --control_socket={work_dir}/control.sock "
                 "--device={device} --health={health} >/dev/null" % sp,
                 "--expect=" + os.path.join(ROOT, "tools", "conform", "sample_plugin.expect")],
    }


def k8s_sample_plugin_run(binary):
    # It hard-codes the kubelet's path: in a mount namespace of its own, a
    # tmpfs over /var/lib (nothing is made on the host) holds that path,
    # with the cell's device-plugins/ bind-mounted on it.
    plugin = ("exec unshare --mount --propagation private -- /bin/sh -c "
              "'mount -t tmpfs dpconform /var/lib && mkdir -p /var/lib/kubelet/device-plugins && "
              "mount --bind \"$1\" /var/lib/kubelet/device-plugins && "
              "exec env PLUGIN_SOCK_DIR=/var/lib/kubelet/device-plugins \"$2\"' sh {plugin_dir} "
              + binary)
    return {
        "name": "k8s-sample-device-plugin",
        "args": ["--resource=example.com/resource", "--plugin=" + plugin,
                 "--expect=" + os.path.join(ROOT, "tests", "realnode", "testdata",
                                            "k8s-sample-device-plugin.expect")],
    }


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dpconform", required=True)
    ap.add_argument("--sample_plugin", required=True)
    ap.add_argument("--k8s_sample_plugin", default="")
    ap.add_argument("--cells", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--work", default="")
    args = ap.parse_args(argv)

    plugins = [sample_plugin_run(args.sample_plugin)]
    if args.k8s_sample_plugin:
        if not os.access(args.k8s_sample_plugin, os.X_OK):
            print("k8s sample device plugin: %s is not built (tools/realnode/build); left out"
                  % args.k8s_sample_plugin)
        elif os.geteuid() != 0:
            print("k8s sample device plugin: needs root (a mount namespace per cell); left out")
        else:
            plugins.append(k8s_sample_plugin_run(args.k8s_sample_plugin))
    work = args.work or tempfile.mkdtemp(prefix="dpc-flakes.", dir="/tmp")
    print("load average at start: %s" % open("/proc/loadavg").read().split()[:3])
    print("%-26s %4s %6s %9s %s" % ("plugin", "run", "cells", "seconds", "outcomes"))

    # (plugin, kubelet, scenario) -> [(run, outcome, dir)]
    seen = collections.defaultdict(list)
    total = 0
    run = 0
    while total < args.cells:
        p = plugins[run % len(plugins)]
        run += 1
        root = os.path.join(work, "r%d" % run)
        os.makedirs(root)
        start = time.monotonic()
        out = subprocess.run([args.dpconform, "--kubelets=all", "--output=json", "--quiet",
                              "--keep", "--jobs=%d" % args.jobs, "--work_dir=" + root]
                             + p["args"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        seconds = time.monotonic() - start
        try:
            report = json.loads(out.stdout)
        except ValueError:
            print("run %d (%s): no report (exit %d): %s" % (
                run, p["name"], out.returncode, out.stderr.decode()[-2000:]))
            return 1
        counts = collections.Counter(c["outcome"] for c in report["cells"])
        for c in report["cells"]:
            seen[(p["name"], c["kubelet"], c["scenario"])].append(
                (run, c["outcome"], c.get("dir", "")))
        total += len(report["cells"])
        print("%-26s %4d %6d %9.1f %s" % (p["name"], run, len(report["cells"]), seconds,
                                          ", ".join("%d %s" % (n, o)
                                                    for o, n in sorted(counts.items()))))

    flaky = {k: v for k, v in seen.items() if len({o for _, o, _ in v}) > 1}
    print("\n%d cells in %d runs; %d distinct cells; %d flaky" % (
        total, run, len(seen), len(flaky)))
    keep = set()
    for (plugin, kubelet, scenario), runs in sorted(flaky.items()):
        print("\nFLAKY %s: %s on kubelet %s" % (plugin, scenario, kubelet))
        for r, outcome, d in runs:
            print("  run %d: %-8s %s" % (r, outcome, d))
            keep.add(d)
    # Only the flaky cells' directories are worth keeping.
    for dirpath, dirnames, _ in os.walk(work, topdown=True):
        for d in list(dirnames):
            full = os.path.join(dirpath, d)
            if d.startswith("c") and d[1:].isdigit() and full not in keep:
                shutil.rmtree(full, ignore_errors=True)
                dirnames.remove(d)
    if not flaky:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print("\nthe flaky cells' files are under %s" % work)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
