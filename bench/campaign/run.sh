#!/usr/bin/env bash
# The benchmark campaign: rerun every workload at the sizes this machine allows,
# then regenerate the results folder and the BENCHMARKS.md page.
#
#   bench/campaign/run.sh [--quick] DIR
#
# Writes DIR/results/<YYYY-MM-DD>-<machine>/ (raw.jsonl, machine.json, tables.md,
# plots), DIR/BENCHMARKS.md and DIR/campaign.log. Every step is bounded by a
# timeout; a step that fails or runs out of time is logged and the campaign goes
# on (the page lists what is missing). Steps with a large and a fallback size try
# the large one first. `--quick` (tiny repository, small K, max-n 100) finishes in
# about 3 minutes. Sizes can be overridden from the environment (BENCH_*, listed
# in bench/README.md and in the steps below).
set -uo pipefail

quick=0
args=()
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$a") ;;
  esac
done
[ "${#args[@]}" -eq 1 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "${args[0]}"
dir=$(cd "${args[0]}" && pwd)
log="$dir/campaign.log"
"$here/run" setup || exit 1
bench="$here/.venv/bin/aspen-bench"

tag=${ASPEN_BENCH_MACHINE:-$(uname -n)}
tag=$(printf '%s' "$tag" | tr -c 'A-Za-z0-9._-' '-')
folder="$dir/results/$(date -u +%F)-$tag"
rm -rf "$folder"
mkdir -p "$folder"

targets=${BENCH_TARGETS:-aspen,aspen-packs,stock}
if [ -z "${BENCH_TARGETS:-}" ] && { command -v apache2 >/dev/null || [ -x /usr/sbin/apache2 ]; }; then
  targets="$targets,stock-apache"
fi

started=$(date +%s)
failed=()
: >"$log"

# step SECONDS aspen-bench-run-arguments...
step() {
  local limit=$1; shift
  echo "== $(date -u +%T) aspen-bench run $* (limit ${limit}s)" | tee -a "$log" >&2
  timeout -k 60 "$limit" "$bench" run "$@" --targets "$targets" --results-dir "$folder" \
    > >(tee -a "$log") 2> >(tee -a "$log" >&2)
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "== step failed (exit $rc): $*" | tee -a "$log" >&2
    return 1
  fi
}

if [ $quick -eq 1 ]; then
  cmd='`bench/campaign/run.sh --quick DIR`'
  preset=${BENCH_PRESET:-tiny}
  # One run of every workload at its quick size; the whole run is bounded.
  step "${BENCH_QUICK_LIMIT:-360}" all --quick --preset "$preset" --jobs "${BENCH_JOBS:-20}" \
    --max-n "${BENCH_MAX_N:-100}" --pushes "${BENCH_PUSHES:-100}" --seconds "${BENCH_SECONDS:-5}" \
    --clients "${BENCH_CLIENTS:-8}" --fetches "${BENCH_FETCHES:-20}" --history "${BENCH_HISTORY:-50}" || failed+=(all)
else
  cmd='`bench/campaign/run.sh DIR`'
  preset=${BENCH_PRESET:-medium}
  big_n=${BENCH_MAX_N:-10000}; small_n=${BENCH_MAX_N_FALLBACK:-1000}
  big_p=${BENCH_PUSHES:-10000}; small_p=${BENCH_PUSHES_FALLBACK:-1000}
  big_f=${BENCH_FETCHES:-2000}; small_f=${BENCH_FETCHES_FALLBACK:-500}
  step 3600 full-clone depth1-clone warm-fetch --preset "$preset" || failed+=(clones)
  step "${BENCH_HISTORY_LIMIT:-5400}" history-clone --preset "$preset" --history "${BENCH_HISTORY:-1000}" \
    || failed+=(history-clone)
  step 3600 storm-depth1 storm-warm --preset "$preset" --jobs "${BENCH_JOBS:-200}" || failed+=(storms)
  step 2400 clone-concurrency --preset "$preset" --clients "${BENCH_CLIENTS:-32}" || failed+=(clone-concurrency)
  step "${BENCH_STALE_LIMIT:-7200}" stale-branch --preset "$preset" --max-n "$big_n" \
    || step 3600 stale-branch --preset "$preset" --max-n "$small_n" || failed+=(stale-branch)
  step "${BENCH_PUSH_LIMIT:-7200}" push-history --preset "$preset" --pushes "$big_p" \
    || step 3600 push-history --preset "$preset" --pushes "$small_p" || failed+=(push-history)
  step 1800 ref-advertisement --preset "$preset" || failed+=(ref-advertisement)
  step 1800 writers --preset "$preset" --writers "${BENCH_WRITERS:-16}" --seconds "${BENCH_SECONDS:-30}" \
    || failed+=(writers)
  step "${BENCH_RANDOM_LIMIT:-7200}" random-fetch --preset "${BENCH_RANDOM_PRESET:-small}" --fetches "$big_f" \
    --protocols "${BENCH_PROTOCOLS:-0,2}" \
    || step 3600 random-fetch --preset "${BENCH_RANDOM_PRESET:-small}" --fetches "$small_f" \
    --protocols "${BENCH_PROTOCOLS:-0,2}" || failed+=(random-fetch)
  # the busy repository against stock as shipped and as a careful operator keeps it (issue 40)
  targets="${BENCH_BUSY_TARGETS:-aspen,stock,stock-maintained}" step 1800 busy-repo --preset "$preset" \
    || failed+=(busy-repo)
  step "${BENCH_LAGGING_LIMIT:-3600}" lagging-clients --preset "${BENCH_LAGGING_PRESET:-small}" \
    --fetches "${BENCH_LAGGING_FETCHES:-120}" --protocols "${BENCH_PROTOCOLS:-0,2}" || failed+=(lagging-clients)
fi

echo "== $(date -u +%T) report" | tee -a "$log" >&2
"$bench" report "$folder" --page "$dir/BENCHMARKS.md" --command "$cmd" >>"$log" 2>&1 \
  || { echo "report failed: see $log" >&2; exit 1; }
secs=$(( $(date +%s) - started ))
echo "campaign: ${secs}s; results $folder; page $dir/BENCHMARKS.md${failed[*]:+; failed: ${failed[*]}}" | tee -a "$log" >&2
[ ${#failed[@]} -eq 0 ]
