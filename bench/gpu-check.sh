#!/usr/bin/env bash
# The one prepared GPU check, for a lent NVIDIA GPU (an H200 here, now and
# then, for a few minutes): build, list devices, run every family against its
# reference on the GPU, tune the MoE stages at the glm5.2 shape for a few M,
# and benchmark the served MoE layer with those configs, and its GEMM stages,
# against the measured device-memory bandwidth. Results and
# the database go under $OUT when set (else ./gpu-check-out).
#
# With no GPU it runs the same steps in compile-only mode (NVRTC for sm_90):
# check compiles a sample of every family and prints registers and spills,
# and tune --compile-only stores resource usage.
#
# Attention (its own section, after the MoE): mla_decode, dsa_indexer and
# mla_prefill at GLM-5.2 dims, the default config (the MMA path where the
# device has matrix instructions) checked against the reference at full
# size, then tuned for --attn-budget each; the trials' times go to the same
# database.
#
# NCCL (its own section, at the end, GPU mode only): bench_comm_gpu opens a
# one-rank "nccl" communicator on the GPU and checks each collective on
# device buffers; skipped where libnccl.so.2 is not installed.
#
# Usage: bench/gpu-check.sh [--arch sm_90] [--budget 90s] [--attn-budget 30s]
set -uo pipefail
cd "$(dirname "$0")/.."

arch=sm_90
budget=90s
attn_budget=30s
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    --attn-budget) attn_budget="$2"; shift ;;
    *) echo "gpu-check.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
out=${OUT:-$PWD/gpu-check-out}
mkdir -p "$out"
log=$out/gpu-check.log
exec > >(tee "$log") 2>&1

step() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }
t0=$(date +%s)

step "build"
if [ ! -x build-gpu/moetune ]; then
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMOETUNE_TESTS=OFF -DMOETUNE_WERROR=OFF >/dev/null &&
    cmake --build build-gpu -j"$(nproc)" --target moetune >/dev/null || exit 1
fi
mt=build-gpu/moetune
export MOETUNE_CACHE=$out/cache

step "devices"
$mt devices --json >"$out/devices.json"
$mt devices
if $mt devices --device cuda >/dev/null 2>&1; then
  dev=(--device cuda)
  mode=gpu
else
  dev=(--device cuda --arch "$arch")
  mode=compile-only
fi
echo "mode: $mode"

step "check every family on ${dev[*]}"
$mt check "${dev[@]}" --samples 2 --json >"$out/check.json"
check_rc=$?
$mt check "${dev[@]}" --samples 0 | tail -3

db=$out/gpu.db
step "tune the MoE stages at glm5.2 (budget $budget per family)"
extra=()
[ $mode = compile-only ] && extra=(--compile-only)
for fam in moe_gemm_up moe_gemm_down moe_route moe_align; do
  $mt tune --family $fam --shape glm5.2 --m 1,16,64,256 "${dev[@]}" --db "$db" \
    --strategy evolve --budget "$budget" --jobs "$(nproc)" --quiet "${extra[@]}" ||
    echo "tune $fam failed (exit $?)"
done
$mt db show --db "$db" | tee "$out/db.txt"
[ $mode = gpu ] && $mt db best --db "$db" | tee "$out/best.txt"

if [ $mode = gpu ]; then
  step "bench: the served MoE layer (tuned configs) and its GEMM stages at glm5.2"
  $mt bench --family moe --shape glm5.2 --m 1,4,16,64,256 "${dev[@]}" --db "$db" \
    | tee "$out/bench.txt"
fi

step "attention at glm5.2: the defaults at full size, then tune (budget $attn_budget each)"
# family shape M-list; check takes the first M
for spec in "mla_decode glm5.2 1,6" "mla_decode glm5.2-dense 1" "dsa_indexer glm5.2 1,4" \
    "mla_prefill glm5.2 256"; do
  read -r fam shape ms <<<"$spec"
  $mt check "${dev[@]}" --family "$fam" --shape "$shape" --m "${ms%%,*}" --samples 0 | tail -2 ||
    { echo "check $fam $shape failed"; check_rc=1; }
  $mt tune --family "$fam" --shape "$shape" --m "$ms" "${dev[@]}" --db "$db" \
    --strategy evolve --budget "$attn_budget" --jobs "$(nproc)" --quiet "${extra[@]}" ||
    echo "tune $fam failed (exit $?)"
done
$mt db show --db "$db" | grep -E "mla_|dsa_" | tee "$out/db-attn.txt"

if [ $mode = gpu ]; then
  step "NCCL: one-rank smoke check on device buffers (comm/comm_gpu.c)"
  # all-reduce, all-gather, reduce-scatter, all-to-all-v, broadcast, barrier,
  # each checked against what one rank must get; skipped (exit 2) where
  # libnccl.so.2 is not installed.
  if [ ! -x build-gpu/bench_comm_gpu ]; then
    cmake --build build-gpu -j"$(nproc)" --target bench_comm_gpu >/dev/null ||
      echo "build of bench_comm_gpu failed"
  fi
  build-gpu/bench_comm_gpu --backend nccl --device 0 | tee "$out/comm-nccl.txt"
  case ${PIPESTATUS[0]} in
    0) ;;
    2) echo "NCCL check skipped: backend or device absent (see above)" ;;
    *) echo "NCCL check FAILED"; check_rc=1 ;;
  esac
fi

step "done in $(( $(date +%s) - t0 )) s; results in $out"
exit $check_rc
