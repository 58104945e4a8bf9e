#!/usr/bin/env bash
# HTTP load benchmark: a bare axum hello-world vs the same app behind tollgate (and behind
# a no-op layer, and tollgate with its headers off), driven over loopback by wrk,
# interleaved. Reports throughput ratios (the median of the per-round ratios, with their
# 25th..75th percentile: the sides of one round run seconds apart, so the machine's drift
# cancels in each) and the p99 latency difference, then the refusals per second of a
# server that refuses nearly everything.
#
#   bash bench/http_load.sh                # 15 rounds of 2 s per side
#   ROUNDS=5 SECS=3 bash bench/http_load.sh
#   PIN=1 bash bench/http_load.sh          # servers on one worker thread pinned to CPU 1,
#                                          # wrk pinned to CPU 0
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-15}
SECS=${SECS:-2}
CONNS=${CONNS:-32}
command -v wrk >/dev/null || { echo "installing wrk"; apt-get install -y -qq wrk >/dev/null; }

cargo build --release -p tollgate-benches --example load_server -q
bin=${CARGO_TARGET_DIR:-target}/release/examples/load_server
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
if [[ ${PIN:-0} == 1 ]]; then
  server=(env WORKERS=1 taskset -c 1 "$bin"); client=(taskset -c 0)
else
  server=("$bin"); client=()
fi
"${server[@]}" bare 18081 & pids+=($!)
"${server[@]}" limited 18082 & pids+=($!)
"${server[@]}" refusing 18083 & pids+=($!)
"${server[@]}" limited-noheaders 18084 & pids+=($!)
"${server[@]}" noop 18085 & pids+=($!)
sleep 1

# wrk -> "req_per_sec p99_us non2xx total"
run() {
  "${client[@]}" wrk -t1 -c"$CONNS" -d"${SECS}s" --latency "http://127.0.0.1:$1/" | awk '
    /^ +99%/ { v=$2; u=v; gsub(/[0-9.]/,"",u); gsub(/[a-z]/,"",v);
               m = (u=="us") ? 1 : (u=="ms") ? 1000 : (u=="s") ? 1000000 : 1; p99 = v*m }
    /Requests\/sec/ { rps = $2 }
    /requests in/ { total = $1 }
    /Non-2xx/ { non = $5 }
    END { printf "%s %s %s %s\n", rps, p99, (non=="" ? 0 : non), total }'
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# "median p25..p75" of the per-round ratios of column 1 of two files
ratios() {
  paste -d' ' <(cut -d' ' -f1 "$1") <(cut -d' ' -f1 "$2") | awk '{print $1/$2}' | sort -g |
    awk '{a[NR]=$1} END {printf "%.3f (%.3f..%.3f)", (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2, a[int(NR/4)+1], a[NR-int(NR/4)]}'
}

: > /tmp/tollgate_bare; : > /tmp/tollgate_limited; : > /tmp/tollgate_noheaders; : > /tmp/tollgate_noop
run 18081 >/dev/null; run 18082 >/dev/null   # warm-up
for r in $(seq "$ROUNDS"); do
  if (( r % 2 )); then order="bare limited noheaders noop"; else order="noop noheaders limited bare"; fi
  for side in $order; do
    case $side in bare) port=18081;; limited) port=18082;; noheaders) port=18084;; noop) port=18085;; esac
    out=$(run $port)
    echo "$out" >> /tmp/tollgate_$side
    echo "round $r $side: $out" >&2
  done
done
bare_rps=$(cut -d' ' -f1 /tmp/tollgate_bare | median)
lim_rps=$(cut -d' ' -f1 /tmp/tollgate_limited | median)
bare_p99=$(cut -d' ' -f2 /tmp/tollgate_bare | median)
lim_p99=$(cut -d' ' -f2 /tmp/tollgate_limited | median)
lim_non=$(cut -d' ' -f3 /tmp/tollgate_limited | sort -g | tail -1)
noh_rps=$(cut -d' ' -f1 /tmp/tollgate_noheaders | median)
noop_rps=$(cut -d' ' -f1 /tmp/tollgate_noop | median)
bytes() { curl -s -i "http://127.0.0.1:$1/" | wc -c; }
ref=$(run 18083)
ref_rps=$(echo "$ref" | cut -d' ' -f1); ref_non=$(echo "$ref" | cut -d' ' -f3); ref_total=$(echo "$ref" | cut -d' ' -f4)

echo
echo "| figure | bare axum | with tollgate | ratio (median of rounds, p25..p75) / difference |"
echo "|---|---|---|---|"
echo "| throughput (req/s, median of rounds) | $bare_rps | $lim_rps | $(ratios /tmp/tollgate_limited /tmp/tollgate_bare) |"
echo "| throughput, rate-limit headers off | $bare_rps | $noh_rps | $(ratios /tmp/tollgate_noheaders /tmp/tollgate_bare) |"
echo "| throughput, a no-op layer (what axum Router::layer itself costs) | $bare_rps | $noop_rps | $(ratios /tmp/tollgate_noop /tmp/tollgate_bare) |"
echo "| throughput, tollgate vs the no-op layer | $noop_rps | $lim_rps | $(ratios /tmp/tollgate_limited /tmp/tollgate_noop) |"
echo "| response size (bytes, headers included) | $(bytes 18081) | $(bytes 18082) (headers off: $(bytes 18084)) | |"
awk -v b="$bare_p99" -v l="$lim_p99" 'BEGIN { printf "| p99 latency (us, median of rounds) | %.0f | %.0f | %+.0f us |\n", b, l, l-b }'
echo "| non-2xx with the admit-all limit (max of rounds) | - | $lim_non | must be 0 |"
awk -v r="$ref_rps" -v n="$ref_non" -v t="$ref_total" 'BEGIN { printf "| refusing server: responses/s, of which 429 | - | %.0f | %.0f refusals/s (%.2f%% refused) |\n", r, r*n/t, 100*n/t }'
