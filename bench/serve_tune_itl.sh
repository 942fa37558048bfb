#!/usr/bin/env bash
# serve_tune_itl.sh: what live tuning costs the requests a server runs,
# measured on one server so that the machine's drift between runs does not
# enter. `moetune serve --tune-misses` on the tiny model on cpu, from an
# empty database and an empty compile cache, under a bench-serve load at
# RATE req/s; the load runs in PAIRS pairs of WIN-second windows, one with
# the tuner paused (SIGUSR1: nothing measured or compiled) and one with it
# running (SIGUSR2), in the order AB BA AB ... so that a trend cancels.
# Prints each window's ITL p50/p95 and the tunes the tuner finished in it,
# then the ratio of ITL p95 (running / paused) per pair, their geometric
# mean with a 95% t-interval over the pairs, and the pairs in which the
# tuner was still working (a pair after "nothing left to tune" compares
# two idle windows).
#
# usage: bench/serve_tune_itl.sh [BUILD_DIR] (default build)
# env:   RATE (req/s; default: half the knee of a sweep on the defaults),
#        PAIRS (10), WIN (s, 20), PORT (18556), KEEP_CACHE (1: the compile
#        cache as it is), LOGS (where the server's log is kept:
#        LOGS/serve_tune_itl.log; default /tmp), MEASURE_BUSY (1: the
#        server with --tune-measure-busy: measurements not bounded by the
#        share while requests run)
set -euo pipefail
build=${1:-build}
moetune=$build/moetune
pairs=${PAIRS:-10}
win=${WIN:-20}
port=${PORT:-18556}
work=$(mktemp -d /tmp/mt_itl.XXXXXX)
trap 'kill "${srv:-0}" 2>/dev/null || true; cp "$work"/serve.log "${LOGS:-/tmp}/serve_tune_itl.log" 2>/dev/null || true; rm -rf "$work"' EXIT
[ "${KEEP_CACHE:-0}" = 1 ] || export MOETUNE_CACHE="$work/cache"
load="--input-len 64 --output-len 32 --cache-hit 0.5"
"$moetune" make-tiny-model --out "$work/tiny" >/dev/null

. "$(dirname "$0")/lib/serve_tiny.sh"
tunes() { grep -cE 'live tuning: .*(first pass|whole budget)$' "$work/serve.log" || true; }

rate=${RATE:-}
if [ -z "$rate" ]; then
  echo "== knee on the defaults"
  serve "$work/knee.db" "$work/knee.log"
  "$moetune" bench-serve --url "http://127.0.0.1:$port" $load \
    --rates 4,8,16,32,64,128,256 --duration 10 --seed 7 | tee "$work/knee.txt" |
    grep -E '^\| [0-9]|^knee'
  stop
  knee=$(awk '/^knee:/ {print $2}' "$work/knee.txt")
  rate=$(awk -v k="$knee" 'BEGIN {printf "%g", k / 2}')
fi
echo "== one server, --tune-misses, $rate req/s, $pairs pairs of $win s windows"
extra=()
[ "${MEASURE_BUSY:-0}" = 1 ] && extra+=(--tune-measure-busy)
serve "$work/t.db" "$work/serve.log" --tune-misses "${extra[@]}"
: >"$work/pairs.txt"
for p in $(seq "$pairs"); do
  if [ $((p % 2)) = 1 ]; then order="paused running"; else order="running paused"; fi
  for w in $order; do
    if [ "$w" = paused ]; then kill -USR1 "$srv"; else kill -USR2 "$srv"; fi
    sleep 1 # a candidate in flight finishes its run
    before=$(tunes)
    row=$("$moetune" bench-serve --url "http://127.0.0.1:$port" $load --rates "$rate" \
      --duration "$win" --seed "$p" | grep '^| [0-9]')
    done_in=$(($(tunes) - before))
    printf 'pair %2d %-7s ITL p50/p95 %-14s success %-6s tunes finished %d\n' "$p" "$w" \
      "$(col "$row" 6)" "$(col "$row" 7)" "$done_in"
    eval "itl_$w=$(itl95 "$row")"
    eval "tunes_$w=$done_in"
  done
  echo "$p ${itl_paused:?} ${itl_running:?} ${tunes_running:?}" >>"$work/pairs.txt"
done
fails=$(metric 'moetune_requests_total{endpoint="completions",outcome="error"}')
swaps=$(metric moetune_kernel_swaps_total)
stop
echo
echo "== summary ($(date -u +%Y-%m-%d), $(nproc) cores, $rate req/s)"
echo "failed requests (server side): ${fails:-0}; swaps: ${swaps:-0}"
awk '
  function tq(df) { # t quantile 0.975
    if (df >= 30) return 2.04
    split("12.71 4.30 3.18 2.78 2.57 2.45 2.36 2.31 2.26 2.23 2.20 2.18 2.16 2.14 2.13 2.12 " \
          "2.11 2.10 2.09 2.09 2.08 2.07 2.07 2.06 2.06 2.06 2.05 2.05 2.05", t, " ")
    return t[df]
  }
  {
    n++; r = $3 / $2; lr[n] = log(r); s += lr[n]
    if ($4 > 0) { busy++; bs += lr[n]; blr[busy] = lr[n] }
    printf "pair %2d: ITL p95 paused %s ms, running %s ms: %.2fx (%d tunes finished)\n", $1, $2, $3, r, $4
  }
  END {
    m = s / n; for (i = 1; i <= n; i++) v += (lr[i] - m) ^ 2
    h = n > 1 ? tq(n - 1) * sqrt(v / (n - 1) / n) : 0
    printf "ITL p95 running / paused, all %d pairs: %.2fx [%.2f, %.2f]\n", n, exp(m), exp(m - h), exp(m + h)
    if (busy > 1) {
      bm = bs / busy; for (i = 1; i <= busy; i++) bv += (blr[i] - bm) ^ 2
      bh = tq(busy - 1) * sqrt(bv / (busy - 1) / busy)
      printf "pairs whose running window finished a tune: %d: %.2fx [%.2f, %.2f]\n", busy, exp(bm), exp(bm - bh), exp(bm + bh)
    }
  }' "$work/pairs.txt"
grep -E 'live tuning: (covered|nothing left)' "$work/serve.log" | head -2 || true
