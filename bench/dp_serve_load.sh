#!/usr/bin/env bash
# dp_serve_load.sh: a load test of data-parallel attention. For each rank
# count in RANKS (default "1 2 4") it starts the tiny model's server (one
# process, or `mpirun -np N moetune serve --ranks N`), runs bench-serve
# against it with CONC concurrent streams for DURATION seconds, and prints
# the client's numbers with the server's per-rank load from /metrics: the
# sequences each rank holds, and the token rows each rank's attention ran
# (the share of all rows in parentheses). Every request must succeed.
#
# Usage: bench/dp_serve_load.sh [BUILD_DIR]   (default: build)
# Environment: RANKS, CONC (8), DURATION (20), INPUT (48), OUTPUT (16),
#              DEVICE (cpu), PORT (18400).
# Speed on a 2-core machine says nothing about real deployments: the ranks
# oversubscribe the cores and Open MPI's shared-memory transport polls.
set -euo pipefail
build=${1:-build}
bin="$build/moetune"
[ -x "$bin" ] || { echo "no $bin: build first" >&2; exit 2; }
RANKS=${RANKS:-"1 2 4"}
CONC=${CONC:-8}
DURATION=${DURATION:-20}
INPUT=${INPUT:-48}
OUTPUT=${OUTPUT:-16}
DEVICE=${DEVICE:-cpu}
PORT=${PORT:-18400}
work=$(mktemp -d)
pid=""
cleanup() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
"$bin" make-tiny-model --out "$work/model" > /dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

printf '%-6s %8s %10s %9s %9s %9s  %s\n' ranks 'req/s' 'out tok/s' 'ITL p50' 'ITL p95' \
    succeeded 'per rank: sequences held / attention rows (share)'
for n in $RANKS; do
    port=$((PORT + n))
    if [ "$n" = 1 ]; then
        "$bin" serve --model "$work/model" --device "$DEVICE" --port "$port" \
            > "$work/serve$n.log" 2>&1 &
    else
        mpirun --oversubscribe -np "$n" "$bin" serve --model "$work/model" --device "$DEVICE" \
            --port "$port" --ranks "$n" > "$work/serve$n.log" 2>&1 &
    fi
    pid=$!
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
        sleep 0.2
    done
    "$bin" bench-serve --url "http://127.0.0.1:$port" --input-len "$INPUT" \
        --output-len "$OUTPUT" --cache-hit 0 --concurrency "$CONC" --duration "$DURATION" \
        --seed 7 > "$work/bench$n.txt" 2>&1 || { cat "$work/bench$n.txt" >&2; exit 1; }
    curl -sf "http://127.0.0.1:$port/metrics" > "$work/metrics$n.txt"
    # bench-serve's table row: | C | req/s | tok/s | TTFT p50 / p95 | ITL p50 / p95 | success | hit |
    row=$(awk -F'|' '$2 ~ /^ *[0-9]/ {
        split($6, itl, " / "); s = $7; sub(/.*\(/, "", s); sub(/\).*/, "", s)
        gsub(/ /, "", $3); gsub(/ /, "", $4); gsub(/^ +| +$/, "", itl[1]); gsub(/^ +| +$/, "", itl[2])
        gsub(/ /, "_", itl[1]); gsub(/ /, "_", itl[2])
        print $3, $4, itl[1], itl[2], s; exit }' "$work/bench$n.txt")
    load=$(awk -v n="$n" '
        /^moetune_rank_sequences\{/ { split($1, a, "\""); s[a[2]] = $2 }
        /^moetune_rank_tokens_total\{/ { split($1, a, "\""); t[a[2]] = $2; all += $2 }
        END {
            if (n == 1) { print "(one rank)"; exit }
            for (r = 0; r < n; r++)
                printf "r%d %d/%d (%.0f%%)  ", r, s[r], t[r], all ? 100 * t[r] / all : 0
        }' "$work/metrics$n.txt")
    read -r rps tps itl50 itl95 ok <<< "$row"
    itl50=${itl50//_/ } itl95=${itl95//_/ }
    printf '%-6s %8s %10s %9s %9s %9s  %s\n' "$n" "$rps" "$tps" "$itl50" "$itl95" "$ok" "$load"
    case "$ok" in */*) [ "${ok%/*}" = "${ok#*/}" ] || { echo "failed requests" >&2; exit 1; } ;; esac
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
    pid=""
done
