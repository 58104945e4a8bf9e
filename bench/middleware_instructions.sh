#!/usr/bin/env bash
# Deterministic companion to `TOLLGATE_RATIOS= cargo bench -p tollgate-benches --bench middleware`: the
# instructions each layer adds to a request over the bare service, counted by valgrind's
# callgrind on the benchmark's loop alone (`--toggle-collect`, so the start-up, and
# quanta's calibration loop in it, which runs a varying number of times, is not counted).
# Each row runs twice, with N1 and N2 requests; the difference divided by N2 - N1 is one
# request's cost, whatever the run's fixed costs. tower_governor's column is its own row
# where it has one (allowed, allowed/headers, refused), else its `allowed`. Every row
# repeats to the instruction but `allowed/counted`, which takes one of two values about 350
# apart (tokio schedules the spawned refund one of two ways).
#
#   bash bench/middleware_instructions.sh                    # needs valgrind
#   ROWS="allowed allowed/headers" bash bench/middleware_instructions.sh
#   FEATURES=tsc ROWS=allowed/tsc-store bash bench/middleware_instructions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-allowed allowed/headers refused exempt/skip exempt/allow-ips allowed/counted allowed/shadow allowed/metrics}
N1=${N1:-20000}
N2=${N2:-60000}
command -v valgrind >/dev/null || { echo "installing valgrind"; apt-get install -y -qq valgrind >/dev/null; }
bench=$(cargo bench -p tollgate-benches ${FEATURES:+--features "$FEATURES"} --bench middleware --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)

# Instructions of one request of row $1 for contender $2.
per_request() {
  local counts=()
  for n in "$N1" "$N2"; do
    counts+=("$(TOLLGATE_PROFILE=$1 TOLLGATE_PROFILE_WHO=$2 TOLLGATE_PROFILE_N=$n \
      valgrind --tool=callgrind --toggle-collect='middleware::batch*' --callgrind-out-file=/dev/null \
      "$bench" --bench 2>&1 | awk '/Collected/ {gsub(",", "", $4); print $4}')")
  done
  echo $(( (counts[1] - counts[0]) / (N2 - N1) ))
}

echo "| row | bare service | tollgate added | tower_governor added | ratio |"
echo "|---|---|---|---|---|"
for row in $ROWS; do
  base=$(per_request "$row" baseline)
  ours=$(( $(per_request "$row" tollgate) - base ))
  case $row in
    allowed | allowed/headers | refused) theirs_row=$row ;;
    *) theirs_row=allowed ;;
  esac
  theirs=$(( $(per_request "$theirs_row" tower_governor) - $(per_request "$theirs_row" baseline) ))
  echo "| $row | $base | $ours | $theirs | $(awk -v a="$ours" -v b="$theirs" 'BEGIN {printf "%.2f", a / b}') |"
done
