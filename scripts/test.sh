#!/usr/bin/env bash
# Builds moetune and runs the whole test suite: a -Werror build (Release, -O3:
# gcc warns at -O3 about things it does not see at -O2) with every
# Criterion test through ctest, then the tests again under ASan/UBSan with
# LeakSanitizer. Each pass runs with TMPDIR on a fresh empty folder and fails
# if the tests leave anything in it. Installs missing Debian packages first.
# Usage: scripts/test.sh [--quick] (--quick skips the sanitizer pass).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

jobs=$(nproc 2>/dev/null || echo 2)
quick=0
[ "${1:-}" = "--quick" ] && quick=1

# ctest with TMPDIR on an empty folder; fails, listing them, when the tests
# leave files or folders behind there.
tmp_root=$(mktemp -d "${TMPDIR:-/tmp}/moetune-test.XXXXXX")
trap 'rm -rf "$tmp_root"' EXIT
ctest_clean_tmp() {
  local t="$tmp_root/tmp"
  rm -rf "$t" && mkdir "$t"
  TMPDIR="$t" ctest "$@"
  local left
  left=$(cd "$t" && find . -mindepth 1 -maxdepth 2 | sort)
  if [ -n "$left" ]; then
    echo "test.sh: the tests left these in TMPDIR:" >&2
    echo "$left" | sed 's/^/  /' >&2
    return 1
  fi
}

# Criterion 2.4 exits 1 after any cr_log_warn, even when every test passed:
# a "skipped, CPU lacks X" warning would turn into a failure on such a CPU.
if grep -rn 'cr_log_warn' tests/; then
  echo "test.sh: cr_log_warn makes a passing test exit 1 (Criterion 2.4): use cr_log_info" >&2
  exit 1
fi

echo "== build (Release, the default build type, with -Werror)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMOETUNE_WERROR=ON -DMOETUNE_TESTS=ON >/dev/null
cmake --build build -j"$jobs"
echo "== tests"
ctest_clean_tmp --test-dir build -j"$jobs" --output-on-failure

if [ $quick -eq 0 ]; then
  echo "== build (ASan + UBSan, -O1)"
  # The kernels the first pass compiled are reused from its cache: the
  # sanitizers check the host code, which a cold cache would only slow.
  # -O1, as the sanitizers' documentation advises: the instrumented
  # emulator runs 2-8x faster than at -O0 (test_attn_mma 50 s -> 6 s).
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" \
        -DMOETUNE_WERROR=ON -DMOETUNE_SANITIZE=ON -DMOETUNE_TESTS=ON \
        -DMOETUNE_TEST_CACHE="$PWD/build/test-cache" >/dev/null
  cmake --build build-asan -j"$jobs"
  echo "== tests under ASan + UBSan + LeakSanitizer"
  # intercept_tls_get_addr=0: gcc 12's sanitizer runtime guesses the bounds
  # of dynamic TLS blocks (those of dlopen'd kernel modules) from a glibc
  # 2.19 header layout; with today's glibc the guess can be garbage and
  # LeakSanitizer's exit scan then crashes in its tracer ("Tracer caught
  # signal 11" in ScanRangeForPointers on a "DTLS" range; the sanitizers'
  # own report: https://github.com/google/sanitizers/issues/1322). Without
  # the interception LeakSanitizer does not scan dynamic
  # TLS (the kernels' __thread scratch and shared memory, no heap pointers
  # that outlive a launch). test_lsan_reports checks that
  # leaks are still reported with these options.
  # Not under the sanitizers: the checks of cpu kernels against their
  # references (test_moe_check_cpu, test_attn_check_cpu_*, test_moe_glm).
  # The cpu kernels are never instrumented, and the host code those tests
  # run (the runner, the kernel set, the cpu backend) runs instrumented in
  # the emu variants, test_moe_pipeline and the model tests; under ASan
  # they spent about a minute on uninstrumented kernels and on references
  # (the first pass runs them). Nor test_gpu_check: a shell script driving
  # the binary end to end (the first pass runs it; 95 s instrumented). Nor
  # the attention families' checks on emu and the wave32 MoE one: the
  # kernels run uninstrumented from the first pass's cache, and the
  # emulator's host code they drive (fibers, barriers, the MMA gather) runs
  # instrumented in test_emu, test_mma_layout, test_moe_mma, test_moe_mma8,
  # test_moe_check_emu64 and test_forward_emu (the six took 233 s here).
  ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1 \
    ctest_clean_tmp --test-dir build-asan -j"$jobs" --output-on-failure \
      -E '^test_((attn|moe)_check_cpu(_v[234]|_base)?|moe_glm|gpu_check|attn_emu|attn_mma8?|indexer_mma|prefill_mma|moe_check_emu32)$'
fi
