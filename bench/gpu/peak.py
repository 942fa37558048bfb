#!/usr/bin/env python3
"""peak.py: the GPU's bf16 matrix peak as PyTorch reaches it: torch.matmul
of two N x N bf16 matrices (cuBLAS; N 8192 by default), timed with CUDA
events after warm-up calls, 2 N^3 flops per call. The best call is the
limit (noise only slows a call); the median is reported too.

Exit status: 0 measured, 1 an error, 2 skipped (no torch, or no GPU).
usage: peak.py [--out FILE] [--n 8192] [--reps 20]
"""
import argparse
import json
import statistics
import sys


def emit(res, out):
    text = json.dumps(res, indent=1, sort_keys=True)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    print(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        emit({"status": "skipped", "reason": "no torch in %s" % sys.executable}, a.out)
        return 2
    if not torch.cuda.is_available():
        emit({"status": "skipped", "reason": "torch %s sees no CUDA device" % torch.__version__},
             a.out)
        return 2
    try:
        n = a.n
        x = torch.randn((n, n), dtype=torch.bfloat16, device="cuda")
        y = torch.randn((n, n), dtype=torch.bfloat16, device="cuda")
        for _ in range(3):
            torch.matmul(x, y)
        ms = []
        for _ in range(max(3, a.reps)):
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            torch.matmul(x, y)
            e1.record()
            e1.synchronize()
            ms.append(e0.elapsed_time(e1))
        flop = 2.0 * n * n * n
        res = {"status": "ok", "n": n, "reps": len(ms), "ms_best": min(ms),
               "ms_median": statistics.median(ms),
               "tflops_best": flop / (min(ms) * 1e9),
               "tflops_median": flop / (statistics.median(ms) * 1e9),
               "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "cuda": torch.version.cuda}
    except Exception as e:  # reported, and the script goes on
        emit({"status": "failed", "reason": "%s: %s" % (type(e).__name__, e)}, a.out)
        return 1
    emit(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
