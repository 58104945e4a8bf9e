#!/usr/bin/env bash
# Deterministic companion to `cargo bench -p tollgate-benches --features redis --bench redis`: instructions
# per decision, client and server, for tollgate's RedisStore batching (the default) and
# unbatched, and for the bare GCRA script, with TASKS concurrent callers (default 64) on
# one connection (the "100 000 random keys, admitted" scenario; SCENARIO="hot key,
# admitted" for the other one). A redis-server on PORT runs under
# valgrind's callgrind, the benchmark (one side at a time, TOLLGATE_REDIS_SIDE) runs under
# callgrind too. Once Redis has read WARM keys (connections open, scripts loaded and
# compiled), both counters are zeroed; SECS seconds later both are dumped and the counts
# are divided by the decisions the benchmark made in between (it prints its count on
# SIGUSR1, sent right after zeroing and right before dumping). The EVALSHA calls give the
# mean batch size (the benchmark runs 60 rounds of 1 s, past SECS). Only the steady state is
# counted. The store's deadline is raised to 60 s: under callgrind round trips take longer
# than the default 200 ms, and decisions past it would fall back to the local limiter. Timed runs on a shared 2-core machine move by several percent between runs;
# these counts do not.
#
# CLIENT=native runs the benchmark without valgrind: the server under callgrind is then
# the bottleneck and saturated, as under heavy load (and batches fill up to the number of
# callers), and only its instructions are counted (the client column reads 0).
#
#   bash bench/redis_instructions.sh           # needs valgrind and redis-server
#   SECS=8 WARM=1000 bash bench/redis_instructions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-16390}
SECS=${SECS:-6}
WARM=${WARM:-500}
SIDES=${SIDES:-bare unbatched batched}
CLIENT=${CLIENT:-callgrind}
TASKS=${TASKS:-64}
SCENARIO=${SCENARIO:-random}
command -v valgrind >/dev/null || { echo "installing valgrind"; apt-get install -y -qq valgrind >/dev/null; }
command -v redis-server >/dev/null || { echo "installing redis-server"; apt-get install -y -qq redis-server >/dev/null; }
bench=$(cargo bench -p tollgate-benches --features redis --bench redis --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
cleanup() {
  pkill -9 -f "callgrind.*redis-server.*$PORT" 2>/dev/null || true
  pkill -9 -f "callgrind.*$(basename "$bench")" 2>/dev/null || true
  [[ -n ${OUT:-} ]] || rm -rf "$out"
}
trap cleanup EXIT
stat() { redis-cli -p "$PORT" info commandstats | awk -F'[=,]' "/cmdstat_$1:/ {print \$2}"; }
evalsha() { stat evalsha; }
gets() { redis-cli -p "$PORT" info stats | awk -F: '/^keyspace_(hits|misses):/ {n += $2} END {print n + 0}'; }
summary() { grep -h '^summary:' "$@" | awk '{print $2}' | tail -1; }

echo "| side | callers | decisions counted | decisions per call | client instructions per decision | server instructions per decision | total |"
echo "|---|---|---|---|---|---|---|"
for side in $SIDES; do
  rm -f "$out"/srv."$side"* "$out"/cli."$side"*
  valgrind --tool=callgrind --callgrind-out-file="$out/srv.$side" \
    redis-server --port "$PORT" --save "" --appendonly no >/dev/null 2>&1 &
  spid=$!
  for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
  REDIS_URL="redis://127.0.0.1:$PORT" TOLLGATE_REDIS_SIDE=$side TOLLGATE_REDIS_TASKS=$TASKS TOLLGATE_REDIS_SCENARIO=$SCENARIO TOLLGATE_REDIS_ROUNDS=60 TOLLGATE_REDIS_DEADLINE_MS=60000 \
    $([[ $CLIENT == native ]] || echo valgrind --tool=callgrind --callgrind-out-file="$out/cli.$side") \
    "$bench" >/dev/null 2>"$out/cli.$side.log" &
  cpid=$!
  for _ in $(seq 600); do [[ $(gets || true) -ge $WARM ]] 2>/dev/null && break; sleep 0.2; done
  callgrind_control --zero "$spid" >/dev/null
  [[ $CLIENT == native ]] || callgrind_control --zero "$cpid" >/dev/null
  c0=$(evalsha)
  kill -USR1 "$cpid"
  sleep "$SECS"
  kill -USR1 "$cpid"
  c1=$(evalsha)
  [[ $CLIENT == native ]] || callgrind_control --dump=measured "$cpid" >/dev/null
  callgrind_control --dump=measured "$spid" >/dev/null
  for _ in $(seq 100); do [[ $(grep -c '^decisions:' "$out/cli.$side.log") -ge 2 ]] && break; sleep 0.1; done
  kill -9 "$cpid" "$spid" 2>/dev/null || true
  wait "$cpid" "$spid" 2>/dev/null || true
  calls=$((c1 - c0))
  n=$(grep '^decisions:' "$out/cli.$side.log" | awk 'NR == 1 {a = $2} NR == 2 {print $2 - a}')
  cli=0
  [[ $CLIENT == native ]] || cli=$(summary "$out"/cli."$side".*)
  srv=$(summary "$out"/srv."$side".*)
  per_call=$(awk -v n="$n" -v c="$calls" 'BEGIN { printf "%.1f", n / c }')
  echo "| $side | $TASKS | $n | $per_call | $((cli / n)) | $((srv / n)) | $(((cli + srv) / n)) |"
done
