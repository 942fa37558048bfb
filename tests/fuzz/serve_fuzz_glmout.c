/* serve_fuzz_glmout.c: libFuzzer target for the GLM output parser
 * (reasoning and tool calls, serve/serve_glmout.h): arbitrary output text,
 * whole, in pieces the input chooses and byte by byte, must never
 * crash and must keep the invariants of serve_glmout_check.h. Built and run
 * by serve_fuzz.sh; tests/test_serve_glmout.c replays the seeds and
 * mutations of them in CI. */
#include <stdint.h>

#include "serve_glmout_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    serve_glmout_check(data, size);
    return 0;
}
