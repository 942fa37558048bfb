#!/usr/bin/env bash
# serve_tune_accept.sh: `moetune serve --tune-misses` end to end on the
# tiny model on cpu. Finds the knee of a bench-serve load on the defaults,
# then at half the knee rate: (A) a server on an empty database without
# tuning; (B) a server on an empty database with --tune-misses, loaded in
# chunks until its tuner says nothing is left to tune (at most LIMIT s);
# (C) a server on the database B wrote, no tuning. Prints each run's
# bench-serve row, how long B took to cover what its load called, its swaps
# and failed requests, ITL p95 of B against A, and the paired model check
# of B's database against the defaults (build/bench_db_ab).
#
# usage: bench/serve_tune_accept.sh [BUILD_DIR] (default build)
# env:   CHUNK (s per load chunk, 30), LIMIT (s, 600), PORT (18555),
#        BUDGET (--tune-budget, default 24 trials per kernel and M: the
#        server's default, 15% of each space, takes about 2 minutes for one
#        expert GEMM bucket of the tiny model here)
set -euo pipefail
build=${1:-build}
moetune=$build/moetune
chunk=${CHUNK:-30}
limit=${LIMIT:-600}
port=${PORT:-18555}
budget=${BUDGET:-24}
work=$(mktemp -d /tmp/mt_accept.XXXXXX)
trap 'kill "${srv:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
load="--input-len 64 --output-len 32 --cache-hit 0.5"
"$moetune" make-tiny-model --out "$work/tiny" >/dev/null

serve() { # serve DB LOG [extra options]: starts a server, waits for /health
  local db=$1 log=$2
  shift 2
  [ -e "$db" ] || : >"$db" # an empty file is a new database
  "$moetune" serve --model "$work/tiny" --db "$db" --device cpu --port "$port" "$@" 2>"$log" &
  srv=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server did not come up: $(tail -3 "$log")" >&2
  exit 1
}
stop() { kill -INT "$srv"; wait "$srv" || true; }
bench() { # bench RATE DURATION: the table row of one rate
  "$moetune" bench-serve --url "http://127.0.0.1:$port" $load --rates "$1" --duration "$2" \
    --seed 7 | grep '^| [0-9]'
}
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
col() { echo "$1" | awk -F'|' -v c="$2" '{gsub(/^ +| +$/, "", $c); print $c}'; }
itl95() { col "$1" 6 | awk -F'/' '{gsub(/ ms/, "", $2); gsub(/ /, "", $2); print $2}'; }

echo "== knee on the defaults"
serve "$work/knee.db" "$work/knee.log"
"$moetune" bench-serve --url "http://127.0.0.1:$port" $load --rates 4,8,16,32,64 \
  --duration 10 --seed 7 | tee "$work/knee.txt" | grep -E '^\| [0-9]|^knee'
stop
knee=$(awk '/^knee:/ {print $2}' "$work/knee.txt")
rate=$(awk -v k="$knee" 'BEGIN {printf "%g", k / 2}')
echo "half the knee: $rate req/s"

echo "== A: empty database, no tuning"
serve "$work/a.db" "$work/a.log"
rowa=$(bench "$rate" "$chunk")
echo "$rowa"
stop

echo "== B: empty database, --tune-misses"
serve "$work/b.db" "$work/b.log" --tune-misses --tune-budget "$budget"
t0=$(date +%s)
rowsb=()
while :; do
  row=$(bench "$rate" "$chunk")
  rowsb+=("$row")
  echo "$row"
  # covered: the tuner's last word is that the load's kernels are all tuned
  grep 'live tuning:' "$work/b.log" | tail -1 | grep -q 'nothing left to tune' && break
  [ $(( $(date +%s) - t0 )) -ge "$limit" ] && { echo "not covered within $limit s"; break; }
done
covered=$(( $(date +%s) - t0 ))
swaps=$(metric moetune_kernel_swaps_total)
undone=$(metric moetune_kernel_swaps_undone_total)
fails=$(metric 'moetune_requests_total{endpoint="completions",outcome="error"}')
tuned=$(grep -c 'live tuning: .* M=.* trials' "$work/b.log" || true)
confirmed=$(grep -c 'live tuning: .*: confirmed ' "$work/b.log" || true)
stop

echo "== C: the database B wrote, no tuning"
cp "$work/b.db" "$work/c.db"
serve "$work/c.db" "$work/c.log"
rowc=$(bench "$rate" "$chunk")
echo "$rowc"
stop

itla=$(itl95 "$rowa")
worst=0
for r in "${rowsb[@]}"; do
  v=$(itl95 "$r")
  worst=$(awk -v a="$worst" -v b="$v" 'BEGIN {print (b > a) ? b : a}')
done
echo
echo "== summary ($(date -u +%Y-%m-%d), $(nproc) cores)"
echo "rate $rate req/s (knee $knee); B covered its load's kernels in ${covered} s: $tuned tuned," \
     "$confirmed confirmed, $swaps swapped in, $undone swapped back, failed requests: ${fails:-0}"
echo "ITL p95: A $itla ms; B worst chunk $worst ms ($(awk -v a="$itla" -v b="$worst" \
     'BEGIN {if (a > 0) printf "%.2fx", b / a; else print "n/a"}'))"
echo "tok/s at that rate: A $(col "$rowa" 4), C $(col "$rowc" 4); ITL p50/p95 A $(col "$rowa" 6), C $(col "$rowc" 6)"
"$build/bench_db_ab" --model "$work/tiny" --db "$work/b.db" --rounds 10
