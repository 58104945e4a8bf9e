#!/usr/bin/env bash
# Deterministic companion to `TOLLGATE_RATIOS=check cargo bench -p tollgate-benches --bench core`: the
# instructions of one check, counted by valgrind's callgrind over the whole run of one
# case's batch (`TOLLGATE_PROFILE`). Each row runs twice, with N1 and N2 checks; the
# difference divided by N2 - N1 is one check's cost, since everything else in the run
# (building the store, filling 1 M keys) is the same in both.
#
#   bash bench/core_instructions.sh                          # needs valgrind
#   ROWS="check/1key/allow" bash bench/core_instructions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-check/1key/allow check/1key/deny check/1M/allow check/1M/deny}
N1=${N1:-1000000}
N2=${N2:-3000000}
command -v valgrind >/dev/null || { echo "installing valgrind"; apt-get install -y -qq valgrind >/dev/null; }
bench=$(cargo bench -p tollgate-benches ${FEATURES:+--features "$FEATURES"} --bench core --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)

per_check() {
  local counts=()
  for n in "$N1" "$N2"; do
    counts+=("$(TOLLGATE_PROFILE=$1 TOLLGATE_PROFILE_WHO=$2 TOLLGATE_PROFILE_N=$n \
      valgrind --tool=callgrind --callgrind-out-file=/dev/null \
      "$bench" --bench 2>&1 | awk '/Collected/ {gsub(",", "", $4); print $4}')")
  done
  echo $(( (counts[1] - counts[0]) / (N2 - N1) ))
}

echo "| row | tollgate | governor | ratio |"
echo "|---|---|---|---|"
for row in $ROWS; do
  ours=$(per_check "$row" tollgate)
  theirs=$(per_check "$row" governor)
  echo "| $row | $ours | $theirs | $(awk -v a="$ours" -v b="$theirs" 'BEGIN {printf "%.2f", a / b}') |"
done
