#!/usr/bin/env bash
# tools/bench/scale.sh: what dpproxy costs at rest, by size. For each
# RESOURCESxDEVICES case it starts kubelet_sim, dpproxy and one sample plugin
# per resource (real processes), waits until every device reached the
# kubelet, then reads dpproxy's CPU time over an idle window, its resident
# memory and threads, beside the same figures for one sample plugin (the
# floor: a process holding one resource's list and one stream).
# A benchmark that prints figures; nothing here has a time limit.
#
#   tools/bench/scale.sh BIN_DIR [IDLE_SECONDS] [CASE ...]    CASE: 1x8, 8x10000, ...
set -euo pipefail

bin="$1"; shift
idle="${1:-20}"; shift || true
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || cases=(1x8 8x10000 16x10000)
hz="$(getconf CLK_TCK)"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
status_kb() { awk -v f="$2:" '$1 == f {print $2}' "/proc/$1/status"; }

printf 'load average at start: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-10s %-14s %12s %12s %9s   %-26s\n' "case" "process" "idle CPU" "RSS" "threads" "(idle window ${idle}s)"
for c in "${cases[@]}"; do
  resources="${c%x*}"; devices="${c#*x}"
  dir="$(mktemp -d /tmp/dpp-scale.XXXXXX)"
  pids=()
  "$bin/kubelet_sim" serve --root_dir="$dir/k" >"$dir/sim.log" 2>&1 & sim=$!
  "$bin/dpproxy" --kubelet_root="$dir/k" --plugin_dir="$dir/p" --state_dir="$dir/s" \
    --status_file="$dir/status.json" --metrics_address= --minloglevel=2 >"$dir/dpproxy.log" 2>&1 &
  proxy=$!
  for ((i = 1; i <= 50; i++)); do [[ -S "$dir/p/kubelet.sock" ]] && break; sleep 0.1; done
  for ((r = 1; r <= resources; r++)); do
    "$bin/sample_plugin" --resource="r$r.example.com/dev" --devices="$devices" \
      --socket_name="r$r.sock" --kubelet_socket="$dir/p/kubelet.sock" --quiet >/dev/null 2>&1 &
    pids+=($!)
  done
  # Every device at the kubelet (the simulator's own view).
  ok=1
  for ((r = 1; r <= resources; r++)); do
    "$bin/kubelet_sim" wait --root_dir="$dir/k" --resource="r$r.example.com/dev" \
      --min_healthy="$devices" --timeout=120s >/dev/null 2>&1 || ok=0
  done
  if [[ $ok -eq 0 ]]; then
    echo "$c: not every device reached the kubelet within 120 s; skipped" >&2
  else
    p0="$(cpu_ticks "$proxy")"; q0="$(cpu_ticks "${pids[0]}")"
    sleep "$idle"
    p1="$(cpu_ticks "$proxy")"; q1="$(cpu_ticks "${pids[0]}")"
    pct() { python3 -c "print(f'{100*($2-$1)/$hz/$idle:.2f}%')"; }
    printf '%-10s %-14s %12s %9s kB %9s\n' "$c" "dpproxy" "$(pct "$p0" "$p1")" \
      "$(status_kb "$proxy" VmRSS)" "$(status_kb "$proxy" Threads)"
    printf '%-10s %-14s %12s %9s kB %9s\n' "" "one plugin" "$(pct "$q0" "$q1")" \
      "$(status_kb "${pids[0]}" VmRSS)" "$(status_kb "${pids[0]}" Threads)"
  fi
  kill "${pids[@]}" "$proxy" "$sim" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir"
done
