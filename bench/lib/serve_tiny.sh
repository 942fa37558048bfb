# serve_tiny.sh: shell helpers the serving benchmarks source: a server on
# the tiny model on cpu, and columns of bench-serve's table. The caller
# sets moetune (the binary), work (a scratch folder holding tiny/, the
# model) and port; serve sets srv (the server's pid).

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
# metric NAME: a sample of the running server's /metrics
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
# col ROW N: column N of a bench-serve table row; itl95 ROW: its ITL p95 in ms
col() { echo "$1" | awk -F'|' -v c="$2" '{gsub(/^ +| +$/, "", $c); print $c}'; }
itl95() { col "$1" 6 | awk -F'/' '{gsub(/ ms/, "", $2); gsub(/ /, "", $2); print $2}'; }
