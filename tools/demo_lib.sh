# Shared by tools/demo.sh and tools/demo_dra.sh (sourced, not run): the
# cleanup of their processes and directory, and how they print steps and
# events. Expects SIM (kubelet_sim), DIR and PIDS to be set by the script.

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}

bold() { if [[ -t 1 ]]; then printf '\033[1m%s\033[0m\n' "$*"; else printf '%s\n' "$*"; fi; }
step() { echo; bold "== $*"; }

# Prints chosen events of a JSON-lines file readably.
show_events() {
  local file="$1"; shift
  local only; only="$(IFS=,; echo "$*")"
  "$SIM" events --events="$file" --only="$only" | cut -c1-170 | sed 's/^/   /'
}

# Polls (50 ms) until the command succeeds, for at most 10 s.
wait_for() {
  for _ in $(seq 200); do "$@" >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "   (gave up waiting for: $*)"; return 1
}
