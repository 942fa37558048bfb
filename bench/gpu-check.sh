#!/usr/bin/env bash
# The one prepared GPU check, for a lent NVIDIA GPU (an H100 or H200, a few
# minutes): everything in one call, results as JSON ($OUT/gpu-check.json)
# and a short text table ($OUT/gpu-check.txt), $OUT else ./gpu-check-out.
#
#   deps        the build's hard dependencies (SQLite, cJSON, libffi,
#               civetweb, PCRE2 headers, cmake, a C compiler, pkg-config),
#               each missing one named; optional ones (Criterion, NVRTC, the
#               driver, NCCL, torch) listed
#   build       Release, the project's CMake with tests off (Criterion may be
#               absent), targets moetune, bench_attn, bench_comm_gpu only
#   devices     moetune devices; a CUDA device listed: GPU mode, else
#               compile-only (NVRTC for --arch, sm_90 by default)
#   peak        the bf16 matrix peak: torch.matmul of 8192^3 (bench/gpu/peak.py)
#   moe-bench   the served MoE layer at glm5.2 and its two expert GEMM stages
#               alone, per M (default 1,16,256,4096), default configs, CUDA
#               events, against the bandwidth the project's probe kernels
#               measure in the same run (bench/lib/limits.h); it also dumps
#               the layer's inputs, weights and output (outside $OUT: the
#               dump is GBs). Compile-only: the stages' default kernels
#               compiled per M (moetune isa)
#   moe-peer    the same layer in plain PyTorch on the dump's weights and
#               routing (bench/gpu/moe_peer.py), and moetune's output checked
#   attention   bench_attn: mla_decode, dsa_indexer, rope, mla_prefill at
#               GLM-5.2 dims against the same limits
#   attn-check  the decode-path attention defaults against the reference at
#               full size (compile-only: compiled)
#   nccl        bench_comm_gpu: a one-rank communicator on device buffers
#   check       moetune check on every family (one process per family, in
#               parallel), every code path plus --samples configs
#   tune-*      a short tune (--tune-budget seconds each) of each of the
#               layer's kernels at the keys the layer looks up
#   moe-tuned   the layer again with the tuned database
#   report      bench/gpu/report.py: gpu-check.json and gpu-check.txt
# Every step runs under a cap and the time guard (no step starts after
# --time-limit seconds, 450 by default, and none runs more than 30 s past
# it: 8 minutes in all); a failed step is reported and the next one runs.
# Exit 0 when no step failed.
#
# Usage: OUT=dir bench/gpu-check.sh [--arch sm_90] [--ms 1,16,256,4096]
#          [--samples 1] [--tune-budget 10] [--families a,b] [--time-limit 450]
#          [--quick]
# --quick (the CI rehearsal): three small families, --samples 0, tune budgets
# of 3 s, two attention checks. Environment: MOETUNE_GPU_CHECK_BUILD (build
# folder, default build-gpu; one already configured is only built),
# MOETUNE_GPU_CHECK_DUMP (the dump's folder, default a fresh one under
# $TMPDIR, removed at the end), PYTHON (an interpreter with torch; default:
# python3 or /usr/bin/python3, the first that imports torch),
# MOETUNE_CACHE (kernel compile cache; default $build/gpu-check-cache).
set -uo pipefail
cd "$(dirname "$0")/.."
src=$PWD

arch=sm_90
ms=1,16,256,4096
samples=1
samples_set=0
tune_budget=10
families=
time_limit=450
quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="$2"; shift ;;
    --ms) ms="$2"; shift ;;
    --samples) samples="$2"; samples_set=1; shift ;;
    --tune-budget) tune_budget="${2%s}"; shift ;;
    --families) families="$2"; shift ;;
    --time-limit) time_limit="$2"; shift ;;
    --quick) quick=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done
if [ $quick = 1 ]; then
  [ -n "$families" ] || families=rmsnorm,moe_align,moe_combine
  [ $samples_set = 1 ] || samples=0
  tune_budget=3
fi

out=${OUT:-$PWD/gpu-check-out}
mkdir -p "$out/logs" || exit 1
out=$(cd "$out" && pwd)
build=${MOETUNE_GPU_CHECK_BUILD:-build-gpu}
case "$build" in /*) ;; *) build=$src/$build ;; esac
dump_own=0
if [ -n "${MOETUNE_GPU_CHECK_DUMP:-}" ]; then
  dump=$MOETUNE_GPU_CHECK_DUMP
else
  dump=$(mktemp -d "${TMPDIR:-/tmp}/moetune-gpu-dump.XXXXXX") && dump_own=1
fi
trap '[ $dump_own = 1 ] && rm -rf "$dump"' EXIT
export MOETUNE_CACHE=${MOETUNE_CACHE:-$build/gpu-check-cache}
mt=$build/moetune
db=$out/gpu.db
jobs=$(nproc 2>/dev/null || echo 2)
t0=$(date +%s)
deadline=$((t0 + time_limit))
steps=$out/steps.tsv
: >"$steps"
rm -f "$out"/*.jsonl "$out"/*.json "$out"/gpu-check.txt "$db"
rm -rf "$out/check" "$out/attn-check" "$out/moe-isa"
exec > >(tee "$out/gpu-check.log") 2>&1

# Python with torch for the peak and the peer, any python3 for the report.
py_torch=${PYTHON:-}
if [ -z "$py_torch" ]; then
  for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1; then
      py_torch=$p
      break
    fi
  done
fi
py=$(command -v python3 || true)
[ -n "$py_torch" ] || py_torch=${py:-python3}

# record NAME STATUS SECONDS NOTE: one row of steps.tsv
record() {
  local note=${4//$'\t'/ }
  note=${note//$'\n'/ }
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${note:0:300}" >>"$steps"
  printf '   %-12s %-8s %4ss  %s\n' "$1" "$2" "$3" "${note:0:200}"
}

# step NAME CAP [--skip-rc N] [--leave S] FUNCTION: runs FUNCTION (defined
# below) in a fresh bash under timeout, its output in logs/NAME.log; the
# step's status goes to steps.tsv. Exit N means skipped (the function's
# last line of output is why); 124 a timeout. Nothing starts after the
# deadline; with --leave S, nothing after S seconds before it, and the step
# ends by then (room for the steps after it).
step() {
  local name=$1 cap=$2 skip_rc=-1 leave=0
  shift 2
  if [ "$1" = --skip-rc ]; then skip_rc=$2; shift 2; fi
  if [ "$1" = --leave ]; then leave=$2; shift 2; fi
  local fn=$1 now left
  now=$(date +%s)
  left=$((deadline - leave - now))
  if [ "$left" -le 0 ] && [ "$name" != report ]; then
    record "$name" not-run 0 "time guard: ${time_limit}s had passed$([ "$leave" = 0 ] ||
      echo " less ${leave}s kept for the steps after it")"
    return 1
  fi
  # A step that starts just before the deadline may run 30 s past it:
  # the whole run ends within --time-limit + 30 s (and the report).
  left=$((left + 30))
  [ "$name" = report ] && left=60
  [ "$cap" -gt "$left" ] && cap=$left
  echo "== $name (at $((now - t0))s, cap ${cap}s)"
  local log=$out/logs/$name.log
  timeout -k 5 "$cap" bash -c "$(declare -f "$fn"); $fn" >"$log" 2>&1
  local rc=$? secs=$(($(date +%s) - now)) last
  last=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)
  if [ $rc = 0 ]; then
    record "$name" ok "$secs" "$last"
  elif [ $rc = "$skip_rc" ]; then
    record "$name" skipped "$secs" "$last"
  elif [ $rc = 124 ] || [ $rc = 137 ]; then
    record "$name" timeout "$secs" "stopped after ${cap}s (logs/$name.log)"
  else
    record "$name" failed "$secs" "exit $rc: $last"
  fi
  return $rc
}

export src out build mt db dump arch ms samples tune_budget families jobs quick py py_torch

deps() {
  missing=()
  for t in cmake make pkg-config cc; do
    command -v $t >/dev/null 2>&1 || missing+=("$t")
  done
  for h in sqlite3.h:libsqlite3-dev cjson/cJSON.h:libcjson-dev ffi.h:libffi-dev \
      civetweb.h:libcivetweb-dev pcre2.h:libpcre2-dev; do
    printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <%s>\n' "${h%%:*}" |
      cc $(pkg-config --cflags libffi 2>/dev/null) -E -x c - >/dev/null 2>&1 ||
      missing+=("${h#*:} (${h%%:*})")
  done
  for l in libcjson libffi sqlite3 libpcre2-8; do
    pkg-config --exists $l 2>/dev/null || missing+=("$l.pc (pkg-config)")
  done
  have() { ldconfig -p 2>/dev/null | grep -q "$1" && echo yes || echo no; }
  printf 'optional: criterion %s, nvrtc %s, libcuda %s, nccl %s, torch %s\n' \
    "$(have libcriterion)" "$(have libnvrtc)" "$(have libcuda.so.1)" "$(have libnccl.so.2)" \
    "$("$py_torch" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo no)"
  if [ ${#missing[@]} -gt 0 ]; then
    [ -x "$mt" ] && echo "(an earlier build in $build is used)"
    echo "missing: ${missing[*]}"
    return 1
  fi
  echo "all build dependencies present"
}

build_step() {
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOETUNE_TESTS=OFF \
      -DMOETUNE_WERROR=OFF || return 1
  fi
  cmake --build "$build" -j"$jobs" --target moetune bench_attn bench_comm_gpu || return 1
  echo "built moetune, bench_attn, bench_comm_gpu in $build"
}

devices() {
  "$mt" devices || return 1
  "$mt" devices --json >"$out/devices.json" || return 1
  if grep -q '"backend":[[:space:]]*"cuda"' "$out/devices.json"; then
    echo "mode: gpu"
  else
    echo "mode: compile-only (no CUDA device; NVRTC for $arch)"
  fi
}

peak() {
  "$py_torch" "$src/bench/gpu/peak.py" --out "$out/peak.json" || { rc=$?
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("reason",""))' \
      "$out/peak.json" 2>/dev/null; return $rc; }
}

moe_bench() {
  rm -rf "$dump" && mkdir -p "$dump"
  "$mt" bench --family moe --shape glm5.2 --m "$ms" --device cuda --json --max-reps 20 \
    --max-ms 400 --dump "$dump" >"$out/moe-default.jsonl" || return 1
  grep -c '"stage"' "$out/moe-default.jsonl" | sed 's/$/ result lines/'
}

# Compile-only: the two stages' default kernels per M, as the layer keys them.
moe_compile() {
  mkdir -p "$out/moe-isa"
  for m in ${ms//,/ }; do
    echo "moe_gemm_up glm5.2 $m up"
    echo "moe_gemm_down glm5.2-rows $m down"
  done | xargs -P "$jobs" -L 1 bash -c '"$mt" isa --device cuda --arch "$arch" --family "$0" \
      --shape "$1" --m "$2" --json >"$out/moe-isa/$3_$2.json" 2>"$out/moe-isa/$3_$2.err" ||
      { echo "isa $0 M=$2 failed: $(tail -n 1 "$out/moe-isa/$3_$2.err")"; exit 1; }'
  [ $? = 0 ] || return 1
  echo "$(ls "$out/moe-isa"/*.json | wc -l) stage kernels compiled (no timing without a GPU)"
}

moe_peer() {
  [ -f "$dump/meta.json" ] || { echo "no dump: the layer did not run"; return 2; }
  "$py_torch" "$src/bench/gpu/moe_peer.py" --dump "$dump" --out "$out/peer.json" \
    --device cuda --reps 20 >/dev/null
  rc=$?
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["status"], r.get("reason",""))' \
    "$out/peer.json" 2>/dev/null
  rm -rf "$dump"/*
  return $rc
}

attention() {
  gf=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tflops_best"] * 1000)' \
    "$out/peak.json" 2>/dev/null || echo 0)
  # One run per family: a family that fails leaves the others' rows.
  : >"$out/attn.jsonl"
  bad=
  for fam in mla_decode dsa_indexer rope mla_prefill; do
    "$build/bench_attn" --device cuda --reps 20 --json --peak-gflops "$gf" --only $fam \
      >>"$out/attn.jsonl" || bad="$bad $fam"
  done
  [ -z "$bad" ] || { echo "failed:$bad"; return 1; }
  echo "$(grep -c '"family"' "$out/attn.jsonl") calls timed"
}

attn_check() {
  mkdir -p "$out/attn-check"
  dev="--device cuda"
  [ "$(cat "$out/mode" 2>/dev/null)" = gpu ] || dev="--device cuda --arch $arch"
  list="mla_decode glm5.2 1
dsa_indexer glm5.2 1"
  [ "$quick" = 1 ] || list="$list
mla_decode glm5.2-dense 1
mla_decode glm5.2-fp8 1
mla_decode glm5.2 6
dsa_indexer glm5.2-fp8 1"
  echo "$list" | xargs -P "$jobs" -L 1 bash -c '"$mt" check '"$dev"' --family "$0" \
      --shape "$1" --m "$2" --samples 0 --json >"$out/attn-check/$0_$1_$2.json" \
      2>"$out/attn-check/$0_$1_$2.err" || { echo "$0 $1 M=$2 failed"; exit 1; }'
  [ $? = 0 ] || return 1
  echo "$(echo "$list" | wc -l) attention cases checked at full size"
}

nccl() {
  "$build/bench_comm_gpu" --backend nccl --device 0
}

check() {
  mkdir -p "$out/check"
  dev="--device cuda"
  [ "$(cat "$out/mode" 2>/dev/null)" = gpu ] || dev="--device cuda --arch $arch"
  all=$("$mt" kernels | awk '/^[a-z]/ {print $1}')
  list=
  for f in $all; do
    if [ -z "$families" ] || [[ ",$families," == *",$f,"* ]]; then list="$list $f"; fi
  done
  printf '%s\n' $list >"$out/check/families.txt"
  # One process per family: a fault kills one family's check, not the rest;
  # half the cores each way on a GPU (the references run on the host).
  p=$jobs
  [ "$(cat "$out/mode" 2>/dev/null)" = gpu ] && p=$(( (jobs + 1) / 2 ))
  printf '%s\n' $list | xargs -P "$p" -I{} bash -c '"$mt" check '"$dev"' --family {} \
      --samples "$samples" --json >"$out/check/{}.json" 2>"$out/check/{}.err";
      echo $? >"$out/check/{}.rc"'
  bad=
  for f in $list; do [ "$(cat "$out/check/$f.rc")" = 0 ] || bad="$bad $f"; done
  [ -z "$bad" ] || { echo "failed:$bad"; return 1; }
  echo "$(echo $list | wc -w) families: every code path, and $samples sampled configs per case"
}

# tune_one KERNEL FAMILY KEY (from the environment: TK, TF, TS)
tune_one() {
  extra=
  dev="--device cuda"
  [ "$(cat "$out/mode" 2>/dev/null)" = gpu ] || { extra=--compile-only; dev="--device cuda --arch $arch"; }
  "$mt" tune --family "$TF" --shape "$TS" --m "$ms" $dev --db "$db" --strategy evolve \
    --budget "${tune_budget}s" --jobs "$jobs" --quiet $extra || return 1
  echo "tuned $TF at $TS"
}

moe_tuned() {
  "$mt" bench --family moe_layer --shape glm5.2 --m "$ms" --device cuda --db "$db" --json \
    --max-reps 20 --max-ms 400 >"$out/moe-tuned.jsonl" || return 1
  echo "layer timed with the tuned configs"
}

report() {
  [ -n "$py" ] || { echo "no python3: gpu-check.txt has the steps only"; return 1; }
  "$py" "$src/bench/gpu/report.py" "$out" --ms "$ms" --arch "$arch"
}

# skip NAME WHY: a step that cannot run here (not-run once the guard has
# passed: it would not have run anyway).
skip() {
  if [ "$(date +%s)" -ge "$deadline" ]; then
    record "$1" not-run 0 "time guard: ${time_limit}s had passed"
  else
    record "$1" skipped 0 "$2"
  fi
}

echo "gpu-check: $(date -u +%FT%TZ), out $out, build $build, M $ms, time limit ${time_limit}s"
if step deps 30 deps || [ -f "$build/CMakeCache.txt" ]; then
  step build 300 build_step
else
  record build failed 0 "not attempted: $(grep '^missing:' "$out/logs/deps.log")"
fi
mode=none
if [ ! -x "$mt" ]; then
  skip devices "no moetune (see build)"
elif step devices 30 devices; then
  grep -q '^mode: gpu' "$out/logs/devices.log" && mode=gpu || mode=compile-only
fi
echo "$mode" >"$out/mode"
echo "mode: $mode"

step peak 90 --skip-rc 2 peak
if [ $mode = gpu ]; then
  step moe-bench 180 moe_bench
  step moe-peer 150 --skip-rc 2 moe_peer
  step attention 120 attention
elif [ $mode = compile-only ]; then
  step moe-bench 180 moe_compile
  skip moe-peer "compile-only: no dump (the layer did not run)"
  skip attention "compile-only: bench_attn needs a device to time on"
else
  skip moe-bench "no moetune (see build)"
  skip moe-peer "no moetune (see build)"
  skip attention "no moetune (see build)"
fi
if [ $mode != none ]; then
  step attn-check 120 attn_check
else
  skip attn-check "no moetune (see build)"
fi
if [ $mode = gpu ]; then
  step nccl 60 --skip-rc 2 nccl
else
  skip nccl "no GPU"
fi
if [ $mode != none ]; then
  step check $([ $mode = gpu ] && echo 120 || echo 240) check
  # The layer's kernels at the keys it looks up (the bench's first line);
  # compile-only: the expert GEMMs and router at the glm5.2 presets.
  keys=$(grep '"stage":"keys"' "$out/moe-default.jsonl" 2>/dev/null | head -n 1 |
    python3 -c 'import json,sys
for k in json.load(sys.stdin)["kernels"]: print(k["kernel"], k["family"], k["key"])' 2>/dev/null)
  [ -n "$keys" ] || keys="up moe_gemm_up glm5.2
down moe_gemm_down glm5.2-rows
route moe_route glm5.2
align moe_align glm5.2"
  [ $quick = 1 ] && keys=$(echo "$keys" | grep -E '^(up|down|route|align) ')
  # What the layer's time depends on most first: the time guard may stop
  # the rest.
  keys=$(for k in up down route sh_up sh_down combine align sh_align; do
    echo "$keys" | grep "^$k "; done)
  # The tuned layer (GPU mode) needs about a minute after the tunes.
  tune_leave=0
  [ $mode = gpu ] && tune_leave=75
  while read -r TK TF TS; do
    [ -n "$TK" ] || continue
    export TK TF TS
    step "tune-$TK" $((tune_budget + 90)) --leave "$tune_leave" tune_one
  done <<<"$keys"
  if [ -s "$db" ]; then
    "$mt" db best --db "$db" --json >"$out/db-best.json" 2>/dev/null
  fi
else
  skip check "no moetune (see build)"
fi
if [ $mode = gpu ]; then
  step moe-tuned 120 moe_tuned
else
  skip moe-tuned "$([ $mode = none ] && echo "no moetune (see build)" || echo "no GPU")"
fi
echo "elapsed $(( $(date +%s) - t0 ))" >"$out/elapsed"
step report 60 report
if [ ! -s "$out/gpu-check.json" ]; then
  # No python3: the steps alone, as a table and as JSON.
  { echo "gpu-check ($mode): steps"; column -t -s $'\t' "$steps"; } >"$out/gpu-check.txt"
  { echo '{"format":1,"mode":"'"$mode"'","steps":['
    first=1
    while IFS=$'\t' read -r n s secs note; do
      note=${note//\\/\\\\}
      [ $first = 1 ] || echo ','
      first=0
      printf '{"name":"%s","status":"%s","seconds":%s,"note":"%s"}' "$n" "$s" "$secs" "${note//\"/\\\"}"
    done <"$steps"
    echo ']}'; } >"$out/gpu-check.json"
fi
echo
cat "$out/gpu-check.txt"
echo "gpu-check: done in $(( $(date +%s) - t0 ))s; results in $out"
! cut -f2 "$steps" | grep -qE '^(failed|timeout)$'
