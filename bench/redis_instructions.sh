#!/usr/bin/env bash
# Deterministic companion to `cargo bench --features redis --bench redis`: instructions
# per decision, client and server, for tollgate's RedisStore and for the bare GCRA script
# (the "100 000 random keys, admitted" scenario). A redis-server on PORT runs under
# valgrind's callgrind, the benchmark (one side at a time, TOLLGATE_REDIS_SIDE) runs under
# callgrind too, and the counts are divided by the EVALSHA calls Redis reports. Timed runs
# on a shared 2-core machine move by several percent between runs; these counts do not.
#
#   bash bench/redis_instructions.sh           # needs valgrind and redis-server
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-16390}
command -v valgrind >/dev/null || { echo "installing valgrind"; apt-get install -y -qq valgrind >/dev/null; }
command -v redis-server >/dev/null || { echo "installing redis-server"; apt-get install -y -qq redis-server >/dev/null; }
bench=$(cargo bench --features redis --bench redis --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
out=$(mktemp -d)
trap 'pkill -9 -f "callgrind.*redis-server.*$PORT" 2>/dev/null || true; rm -rf "$out"' EXIT

echo "| side | decisions | client instructions per decision | server instructions per decision | total |"
echo "|---|---|---|---|---|"
for side in bare tollgate; do
  valgrind --tool=callgrind --callgrind-out-file="$out/srv.$side" \
    redis-server --port "$PORT" --save "" --appendonly no >/dev/null 2>&1 &
  spid=$!
  for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
  redis-cli -p "$PORT" config resetstat >/dev/null
  REDIS_URL="redis://127.0.0.1:$PORT" TOLLGATE_REDIS_SIDE=$side TOLLGATE_REDIS_SCENARIO=random \
    valgrind --tool=callgrind --callgrind-out-file="$out/cli.$side" "$bench" >/dev/null 2>"$out/cli.$side.log"
  calls=$(redis-cli -p "$PORT" info commandstats | awk -F'[=,]' '/cmdstat_evalsha/ {print $2}')
  callgrind_control --dump=measured "$spid" >/dev/null 2>&1 || true
  sleep 1
  kill -9 "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  cli=$(awk '/refs/ {gsub(",", "", $4); print $4}' "$out/cli.$side.log")
  srv=$(grep -h '^summary:' "$out"/srv."$side".* | awk '{print $2}' | tail -1)
  echo "| $side | $calls | $((cli / calls)) | $((srv / calls)) | $(((cli + srv) / calls)) |"
done
