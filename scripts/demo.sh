#!/usr/bin/env bash
# The main job, end to end, on a fresh machine: build moetune, write a tiny
# GLM-5.2-architecture checkpoint (Quark MXFP4 experts, MLA + DSA attention),
# tune every kernel it needs on the best device here into tuned.db, serve it
# with the tuned kernels, send one chat request, and print the kernel
# selection report and the answer.
#
# Usage: scripts/demo.sh [--quick] [--device D] [--budget B] [--port P]
#   --quick   a reduced run (fewer M buckets, small budget), as CI runs it
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
device=auto
budget=""
port=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --device) device="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    --port) port="$2"; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

bash scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)

echo "== build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs" --target moetune >/dev/null
mt=build/moetune

work=demo
model=$work/tiny-glm5
db=tuned.db
mkdir -p $work
echo "== write a tiny GLM-5.2-architecture checkpoint to $model"
$mt make-tiny-model --out $model --seed 7

if [ $quick -eq 1 ]; then
  mlist=1,4,16
  budget=${budget:-6}
else
  mlist=1,2,4,8,16,32,64,128
  budget=${budget:-24}
fi
echo "== tune every kernel the model needs on '$device' into $db (M = $mlist, budget $budget per M)"
$mt tune --model $model --device "$device" --db $db --m $mlist --budget "$budget" \
  --strategy evolve --jobs "$jobs"

if [ "$port" = 0 ]; then
  port=$(( 20000 + RANDOM % 20000 ))
fi
log=$work/serve.log
echo "== serve on 127.0.0.1:$port (log: $log)"
$mt serve --model $model --db $db --device "$device" --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
  if ! kill -0 $server 2>/dev/null; then echo "server exited:"; cat "$log"; exit 1; fi
  sleep 0.2
done

echo "== kernel selection report (from the server's load)"
sed -n '/kernel selection/,/^$/p' "$log"

echo "== one chat request"
body='{"model":"tiny-glm5","messages":[{"role":"user","content":"Say something about experts."}],"max_tokens":24,"temperature":0}'
answer=$(curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$body")
echo "answer: $(echo "$answer" | jq -r '.choices[0].message.content')"
echo "usage:  $(echo "$answer" | jq -c '.usage')"
