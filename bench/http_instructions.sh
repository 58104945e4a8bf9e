#!/usr/bin/env bash
# Deterministic companion to http_load.sh: user-space instructions per request of the load
# server (examples/load_server.rs, one worker thread) under valgrind's callgrind, for the
# bare app, a no-op layer, each tollgate variant and tower_governor (without and with its
# headers). wrk drives each for SECS seconds after a warm-up; the
# counters are zeroed before and dumped after the measured run, then divided by the number
# of requests wrk completed. Instruction counts do not depend on what else the machine is
# doing, so this pins down what tollgate adds where throughput runs are too noisy; the
# kernel's share (TCP on loopback) is not counted.
#
#   bash bench/http_instructions.sh            # needs valgrind and wrk
#   MODES="bare limited" SECS=5 bash bench/http_instructions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-8}
MODES=${MODES:-bare noop limited-noheaders limited governor governor-headers refusing}
PORT=${PORT:-18090}
command -v wrk >/dev/null || { echo "installing wrk"; apt-get install -y -qq wrk >/dev/null; }
command -v valgrind >/dev/null || { echo "installing valgrind"; apt-get install -y -qq valgrind >/dev/null; }
cargo build --release -p tollgate-benches --example load_server -q
bin=${CARGO_TARGET_DIR:-target}/release/examples/load_server
out=$(mktemp -d)
pid=""
# Only the server this script started is stopped, by its id.
trap '[[ -n $pid ]] && kill -9 "$pid" 2>/dev/null; rm -rf "$out"' EXIT

echo "| server | requests measured | instructions per request | vs bare |"
echo "|---|---|---|---|"
bare=""
for mode in $MODES; do
  WORKERS=1 valgrind --tool=callgrind --callgrind-out-file="$out/$mode" "$bin" "$mode" "$PORT" 2>"$out/$mode.log" &
  pid=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.2; done
  wrk -t1 -c8 -d3s "http://127.0.0.1:$PORT/" >/dev/null          # warm-up
  callgrind_control --zero "$pid" >/dev/null 2>&1
  n=$(wrk -t1 -c8 -d"${SECS}s" "http://127.0.0.1:$PORT/" | awk '/requests in/ {print $1}')
  callgrind_control --dump=measured "$pid" >/dev/null 2>&1
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  ir=$(grep -h '^summary:' "$out/$mode".* | awk '{print $2}' | tail -1)
  per=$(( ir / n ))
  [[ -z $bare && $mode == bare ]] && bare=$per
  if [[ -n $bare ]]; then
    rel=$(awk -v p="$per" -v b="$bare" 'BEGIN { printf "%+d (%+.1f%%)", p - b, 100 * (p - b) / b }')
  else
    rel="-"
  fi
  echo "| $mode | $n | $per | $rel |"
done
