#!/usr/bin/env bash
# serve_tune_accept.sh: `moetune serve --tune-misses` end to end on the
# tiny model on cpu. Finds the knee of a bench-serve load on the defaults,
# then at half the knee rate: (A) a server on an empty database without
# tuning, loaded for SHORT s; (B) a server on an empty database with
# --tune-misses, loaded for LIMIT s in one run (so its ITL p95 is the whole
# tuning period's); (C) a server on the database B wrote, loaded for SHORT
# s. Prints each run's bench-serve row, when B's tuner first and last said
# it had covered what the load called (every kernel and M bucket tuned),
# its swaps and failed requests, ITL p95 of B against A, and the paired
# model check of B's database against the defaults (build/bench_db_ab).
#
# usage: bench/serve_tune_accept.sh [BUILD_DIR] (default build)
# env:   SHORT (s, 120), LIMIT (s, 600), PORT (18555), BUDGET (--tune-budget,
#        default the server's own: 15% of each space), FIRST (--tune-first,
#        default the server's own: 8 trials), KEEP_CACHE (1: use the kernel
#        compile cache as it is; default: an empty one, as on fresh hardware,
#        so every candidate the tuner tries is compiled), LOGS (where B's
#        log and database are kept: LOGS/serve_tune_accept_b.log and .db;
#        default /tmp), RATES
#        (the knee sweep, req/s: 4,8,16,32,64,128,256), COMPILE_BUSY (1: B
#        with --tune-compile-busy, its compilers not held while requests run),
#        MEASURE_BUSY (1: B with --tune-measure-busy, its measurements not
#        bounded by the share while requests run),
#        AB_ROUNDS (paired rounds of the model check, 10), RATE (req/s: load
#        at this rate and skip the knee sweep; the sweep reads 128 or 256 on
#        the same 2-core VM from one hour to the next)
set -euo pipefail
build=${1:-build}
moetune=$build/moetune
short=${SHORT:-120}
limit=${LIMIT:-600}
port=${PORT:-18555}
tune_opts=(--tune-misses)
[ -n "${BUDGET:-}" ] && tune_opts+=(--tune-budget "$BUDGET")
[ -n "${FIRST:-}" ] && tune_opts+=(--tune-first "$FIRST")
[ "${COMPILE_BUSY:-0}" = 1 ] && tune_opts+=(--tune-compile-busy)
[ "${MEASURE_BUSY:-0}" = 1 ] && tune_opts+=(--tune-measure-busy)
rates=${RATES:-4,8,16,32,64,128,256}
work=$(mktemp -d /tmp/mt_accept.XXXXXX)
trap 'kill "${srv:-0}" 2>/dev/null || true; cp "$work"/b.log "${LOGS:-/tmp}/serve_tune_accept_b.log" 2>/dev/null || true; cp "$work"/b.db "${LOGS:-/tmp}/serve_tune_accept_b.db" 2>/dev/null || true; rm -rf "$work"' EXIT
[ "${KEEP_CACHE:-0}" = 1 ] || export MOETUNE_CACHE="$work/cache"
load="--input-len 64 --output-len 32 --cache-hit 0.5"
"$moetune" make-tiny-model --out "$work/tiny" >/dev/null

. "$(dirname "$0")/lib/serve_tiny.sh"
bench() { # bench RATE DURATION: the table row of one rate
  "$moetune" bench-serve --url "http://127.0.0.1:$port" $load --rates "$1" --duration "$2" \
    --seed 7 | grep '^| [0-9]'
}

if [ -n "${RATE:-}" ]; then
  knee="not measured: RATE given"
  rate=$RATE
  echo "== rate $rate req/s (RATE; no knee sweep)"
else
  echo "== knee on the defaults"
  serve "$work/knee.db" "$work/knee.log"
  "$moetune" bench-serve --url "http://127.0.0.1:$port" $load --rates "$rates" \
    --duration 10 --seed 7 | tee "$work/knee.txt" | grep -E '^\| [0-9]|^knee'
  stop
  knee=$(awk '/^knee:/ {print $2}' "$work/knee.txt")
  rate=$(awk -v k="$knee" 'BEGIN {printf "%g", k / 2}')
  echo "half the knee: $rate req/s"
fi

echo "== A: empty database, no tuning"
serve "$work/a.db" "$work/a.log"
rowa=$(bench "$rate" "$short")
echo "$rowa"
stop

echo "== B: empty database, ${tune_opts[*]}"
serve "$work/b.db" "$work/b.log" "${tune_opts[@]}"
rowb=$(bench "$rate" "$limit")
echo "$rowb"
swaps=$(metric moetune_kernel_swaps_total)
undone=$(metric moetune_kernel_swaps_undone_total)
fails=$(metric 'moetune_requests_total{endpoint="completions",outcome="error"}')
left_first=$(metric moetune_tune_pending_first)
left_all=$(metric moetune_tune_pending)
held_all=$(metric moetune_tune_compilers_held_seconds_total)
meas_all=$(metric moetune_tune_measuring_seconds_total)
cost_all=$(metric moetune_tune_measure_cost_seconds_total)
wait_all=$(metric moetune_tune_measure_wait_seconds_total)
stop
first_pass=$(grep -c 'live tuning: .*, first pass$' "$work/b.log" || true)
deep=$(grep -c 'live tuning: .*, whole budget$' "$work/b.log" || true)
confirmed=$(grep -c 'live tuning: .*: confirmed ' "$work/b.log" || true)
cover_first=$(grep -m1 'live tuning: covered:' "$work/b.log" | sed -E 's/.* in ([0-9]+) s[,)].*/\1/' || true)
held=$(grep 'live tuning: covered:' "$work/b.log" | tail -1 | sed -nE 's/.*compilers held ([0-9]+) s.*/\1/p' || true)
# covered at the end: no first pass after the last "covered" line
last_cover=$(grep -n 'live tuning: covered:' "$work/b.log" | tail -1 | cut -d: -f1 || true)
last_first=$(grep -n ', first pass$' "$work/b.log" | tail -1 | cut -d: -f1 || true)
cover_last=none
if [ -n "$last_cover" ] && [ "${last_first:-0}" -lt "$last_cover" ]; then
  cover_last=$(sed -n "${last_cover}p" "$work/b.log" | sed -E 's/.* in ([0-9]+) s[,)].*/\1/')
fi

echo "== C: the database B wrote, no tuning"
cp "$work/b.db" "$work/c.db"
serve "$work/c.db" "$work/c.log"
rowc=$(bench "$rate" "$short")
echo "$rowc"
stop

itla=$(itl95 "$rowa")
itlb=$(itl95 "$rowb")
echo
echo "== summary ($(date -u +%Y-%m-%d), $(nproc) cores)"
echo "rate $rate req/s (knee $knee); B's first passes covered the load's kernels at" \
     "${cover_first:-never} s, covered at the end since ${cover_last} s (of $limit)," \
     "compilers held ${held_all:-${held:-0}} s while requests ran;" \
     "measuring ${meas_all:-?} s taking ${cost_all:-?} s of the device, waiting to measure" \
     "${wait_all:-?} s;" \
     "at the end ${left_first:-?} (kernel, M) without a first pass, ${left_all:-?} to tune;" \
     "$first_pass first passes, $deep searched to the whole budget, $confirmed confirmed," \
     "$swaps swapped in, $undone swapped back; failed requests: ${fails:-0} in B's server," \
     "client successes A $(col "$rowa" 7), B $(col "$rowb" 7), C $(col "$rowc" 7)"
itlc=$(itl95 "$rowc")
echo "ITL p95: A $itla ms, B (while tuning, $limit s) $itlb ms ($(awk -v a="$itla" -v b="$itlb" \
     'BEGIN {if (a > 0) printf "%.2fx", b / a; else print "n/a"}') A's, $(awk -v a="$itlc" \
     -v b="$itlb" 'BEGIN {if (a > 0) printf "%.2fx", b / a; else print "n/a"}') C's: C runs" \
     "untuned too, so A against C shows the spread of two runs without tuning)"
echo "tok/s at that rate: A $(col "$rowa" 4), B $(col "$rowb" 4), C $(col "$rowc" 4);" \
     "ITL p50/p95 A $(col "$rowa" 6), B $(col "$rowb" 6), C $(col "$rowc" 6)"
"$build/bench_db_ab" --model "$work/tiny" --db "$work/b.db" --rounds "${AB_ROUNDS:-10}"
