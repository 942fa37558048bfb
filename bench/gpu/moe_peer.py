#!/usr/bin/env python3
"""moe_peer.py: the served MoE layer in plain PyTorch on the weights and
routing `moetune bench --family moe --dump DIR` wrote (bench/lib/moe_dump.h),
timed with CUDA events, and its output checked against moetune's.

What is timed per token count M, as a PyTorch user would write the layer:
the router (x @ gate^T in fp32, sigmoid, bias for the choice, top-k,
renormalized weights), then, on moetune's routing (its ids and weights, so
both read the same experts; the router's own choice is computed and
dropped), one torch.matmul per routed expert for gate/up and one for down
(cuBLAS, bf16), SiLU x up, the weighted sum by index_add_, and the shared
expert. The MXFP4 weights are dequantized to bf16 once, before any timing
(E2M1 x 2^(s - 127), element 2i in the low nibble of byte i), so PyTorch
reads 16 bits per weight where moetune reads 4.25: the ratio is the
implementations' and their formats' together.

The check runs the same layer once more in fp32 with the activations
quantized to MXFP4 by the rule moetune's a4w4 kernels use (common/mxfp4.h:
the "even" scale rule, E2M1 ties to the even code; h rounded to bf16
between the GEMMs), and holds moetune's output to the tolerance of the
layer tests (meta.json: |got - want| <= 1e-2 max|want of the row| + 1e-2
|want| for every element). The bf16 path's distance from moetune's output
(relative L2; it differs by the activation quantization) is reported too.

Exit status: 0 ok, 1 the check failed or an error, 2 skipped (no numpy or
torch, or no GPU for --device cuda), 3 the dump is malformed. The result is
one JSON object (--out, else stdout); --validate-only checks the dump's
files against meta.json with the standard library alone.

usage: moe_peer.py --dump DIR [--out FILE] [--device cuda|cpu] [--reps N]
                   [--max-seconds S] [--validate-only]
"""
import argparse
import json
import os
import statistics
import sys
import time

DTYPE_BYTES = {"bf16": 2, "f32": 4, "i32": 4, "u8": 1}
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def emit(res, out):
    text = json.dumps(res, indent=1, sort_keys=True)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    print(text)


def file_entries(meta):
    """Every file entry of meta.json (weights, then each M's)."""
    ents = list(meta["files"].values())
    for t in meta["tokens"]:
        ents += [t["x"], t["ids"], t["weights"], t["y"]]
    return ents


def validate(d, meta):
    """Problems with the dump (sizes against shapes, dims), [] when none."""
    bad = []
    H, I, E = meta["hidden"], meta["inter"], meta["n_experts"]
    S, k, n = meta["shared_inter"], meta["topk"], meta["experts_dumped"]
    if meta.get("format") != 1:
        bad.append("format %r, this reader knows 1" % meta.get("format"))
    if meta.get("layout") != "quark":
        bad.append("layout %r, expected quark" % meta.get("layout"))
    if H % 32 or I % 32 or (S and S % 32):
        bad.append("H, I, S must be multiples of 32")
    want = {"w13": [n, 2 * I, H // 2], "s13": [n, 2 * I, H // 32], "w2": [n, H, I // 2],
            "s2": [n, H, I // 32], "gate": [E, H], "bias": [E], "experts": [n]}
    if S:
        want.update({"sh_w13": [2 * S, H // 2], "sh_s13": [2 * S, H // 32],
                     "sh_w2": [H, S // 2], "sh_s2": [H, S // 32]})
    for key, shape in want.items():
        got = meta["files"].get(key, {}).get("shape")
        if got != shape:
            bad.append("%s: shape %s, expected %s" % (key, got, shape))
    for t in meta["tokens"]:
        m = t["m"]
        for key, shape in (("x", [m, H]), ("ids", [m, k]), ("weights", [m, k]), ("y", [m, H])):
            if t[key]["shape"] != shape:
                bad.append("M=%d %s: shape %s, expected %s" % (m, key, t[key]["shape"], shape))
    for ent in file_entries(meta):
        path = os.path.join(d, ent["file"])
        size = DTYPE_BYTES[ent["dtype"]]
        for x in ent["shape"]:
            size *= x
        if not os.path.exists(path):
            bad.append("%s: missing" % ent["file"])
        elif os.path.getsize(path) != size:
            bad.append("%s: %d bytes, expected %d" % (ent["file"], os.path.getsize(path), size))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dump", required=True)
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--max-seconds", type=float, default=3.0,
                    help="timing budget per M (at least 3 calls)")
    ap.add_argument("--validate-only", action="store_true")
    a = ap.parse_args()
    res = {"status": "failed", "dump": a.dump}
    try:
        with open(os.path.join(a.dump, "meta.json")) as f:
            meta = json.load(f)
        bad = validate(a.dump, meta)
    except (OSError, ValueError, KeyError, TypeError) as e:
        bad = ["meta.json: %s" % e]
    if bad:
        res.update(status="malformed", problems=bad)
        emit(res, a.out)
        return 3
    res.update(experts_dumped=meta["experts_dumped"], n_experts=meta["n_experts"],
               act=meta["act"], ms=[t["m"] for t in meta["tokens"]])
    if a.validate_only:
        res["status"] = "ok"
        emit(res, a.out)
        return 0
    try:
        import numpy as np
        import torch
    except ImportError as e:
        res.update(status="skipped", reason="no %s in %s" % (e.name, sys.executable))
        emit(res, a.out)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        res.update(status="skipped", reason="torch %s sees no CUDA device" % torch.__version__)
        emit(res, a.out)
        return 2
    try:
        return run(a, meta, res, np, torch)
    except Exception as e:  # one report whatever broke: the script goes on
        res.update(status="failed", reason="%s: %s" % (type(e).__name__, e))
        emit(res, a.out)
        return 1


def run(a, meta, res, np, torch):
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # the check path is fp32
    F = torch.nn.functional
    H, I, E = meta["hidden"], meta["inter"], meta["n_experts"]
    S, K = meta["shared_inter"], meta["topk"]
    a4 = meta["act"] == "mxfp4"
    res.update(device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
               torch=torch.__version__)

    def load(ent):
        dt = {"bf16": np.int16, "f32": np.float32, "i32": np.int32, "u8": np.uint8}[ent["dtype"]]
        v = torch.from_numpy(np.fromfile(os.path.join(a.dump, ent["file"]), dtype=dt))
        if ent["dtype"] == "bf16":
            v = v.view(torch.bfloat16)
        return v.reshape(ent["shape"]).to(dev)

    lut = torch.tensor(E2M1, dtype=torch.float32, device=dev)

    def dequant(packed, scales, dtype):
        """MXFP4 [R, K/2] + [R, K/32] -> [R, K]: element 2i in the low nibble."""
        codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
        v = lut[codes.long()]
        sc = torch.exp2(scales.float() - 127.0)
        sc = torch.where(scales == 255, torch.full_like(sc, float("nan")), sc)
        return (v * sc.repeat_interleave(32, dim=-1)).to(dtype)

    def q_mxfp4(v):
        """Quantize-dequantize by 32-blocks, moetune's a4 rule (fp32 in, out)."""
        shape = v.shape
        b = v.reshape(-1, 32)
        amax = b.abs().amax(dim=1).contiguous()
        bits = (amax.view(torch.int32).long() + 0x200000) & 0xFF800000
        e = ((bits >> 23) - 127 - 2).clamp(-127, 127)
        sc = torch.exp2(e.float()).unsqueeze(1)
        x = (b / sc).abs()
        code = ((x > 0.25).int() + (x >= 0.75).int() + (x > 1.25).int() + (x >= 1.75).int() +
                (x > 2.5).int() + (x >= 3.5).int() + (x > 5.0).int())
        mag = lut[code.long()]
        return (torch.where(b < 0, -mag, mag) * sc).reshape(shape)

    t0 = time.time()
    f = meta["files"]
    experts = load(f["experts"]).long()
    w13p, s13 = load(f["w13"]), load(f["s13"])
    w2p, s2 = load(f["w2"]), load(f["s2"])
    gate, bias = load(f["gate"]), load(f["bias"])
    # Expert id -> its index in the dump, as host ints: indexing w13 with a
    # device scalar would wait for the device at every expert.
    slot = [-1] * E
    for i, e in enumerate(experts.tolist()):
        slot[e] = i
    res["load_s"] = round(time.time() - t0, 3)
    t0 = time.time()
    n = experts.numel()
    w13 = torch.empty((n, 2 * I, H), dtype=torch.bfloat16, device=dev)
    w2 = torch.empty((n, H, I), dtype=torch.bfloat16, device=dev)
    for i in range(n):
        w13[i] = dequant(w13p[i], s13[i], torch.bfloat16)
        w2[i] = dequant(w2p[i], s2[i], torch.bfloat16)
    del w13p, w2p
    sh = None
    if S:
        sh = (dequant(load(f["sh_w13"]), load(f["sh_s13"]), torch.bfloat16),
              dequant(load(f["sh_w2"]), load(f["sh_s2"]), torch.bfloat16))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    res["dequant_s"] = round(time.time() - t0, 3)
    gate_f = gate.float()

    def router(x):
        s = torch.sigmoid(x.float() @ gate_f.t())
        c = s + bias
        G, TG = meta["ngroup"], meta["topkg"]
        if G > 1:
            g = c.reshape(c.shape[0], G, -1).topk(2, dim=-1).values.sum(-1)
            keep = torch.zeros_like(g, dtype=torch.bool)
            keep.scatter_(1, g.topk(TG, dim=-1).indices, True)
            c = c.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
        ids = c.topk(K, dim=-1).indices
        w = s.gather(1, ids)
        if meta["norm"]:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return ids, w * meta["scale"]

    def experts_bf16(x, ids, tw):
        """The routed experts and the shared one, bf16 weights, fp32 sum."""
        flat = ids.reshape(-1)
        order = torch.argsort(flat)
        counts = torch.bincount(flat, minlength=E).tolist()
        y = torch.zeros((x.shape[0], H), dtype=torch.float32, device=dev)
        wflat = tw.reshape(-1)
        start = 0
        for e, c in enumerate(counts):
            if not c:
                continue
            sel = order[start:start + c]
            start += c
            tok = sel // K
            gu = x[tok] @ w13[slot[e]].t()
            h = F.silu(gu[:, :I]) * gu[:, I:]
            y.index_add_(0, tok, (h @ w2[slot[e]].t()).float() * wflat[sel].unsqueeze(1))
        if sh is not None:
            gu = x @ sh[0].t()
            y += ((F.silu(gu[:, :S]) * gu[:, S:]) @ sh[1].t()).float()
        return y

    def layer_bf16(x, ids, tw):
        router(x)  # computed as a layer would, then moetune's routing is used
        return experts_bf16(x, ids, tw)

    def mlp_ref(xq, wgu, wd, inter):
        """One expert in fp32 as moetune computes it: h in bf16, then a4."""
        gu = xq @ wgu.float().t()
        h = (F.silu(gu[:, :inter]) * gu[:, inter:]).to(torch.bfloat16).float()
        if a4:
            h = q_mxfp4(h)
        return h @ wd.float().t()

    def layer_ref(x, ids, tw):
        xq = q_mxfp4(x.float()) if a4 else x.float()
        y = torch.zeros((x.shape[0], H), dtype=torch.float32, device=dev)
        for e in torch.unique(ids).tolist():
            tok, j = (ids == e).nonzero(as_tuple=True)
            y.index_add_(0, tok, mlp_ref(xq[tok], w13[slot[e]], w2[slot[e]], I) * tw[tok, j].unsqueeze(1))
        if sh is not None:
            y += mlp_ref(xq, sh[0], sh[1], S)
        return y

    def timed(fn, *args):
        if dev.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn(*args)
            e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1)
        t = time.perf_counter()
        fn(*args)
        return (time.perf_counter() - t) * 1e3

    rows, failed = [], False
    tol = meta["tolerance"]
    for t in meta["tokens"]:
        M = t["m"]
        x, ids, tw, ymt = load(t["x"]), load(t["ids"]).long(), load(t["weights"]), load(t["y"])
        if any(slot[e] < 0 for e in torch.unique(ids).tolist()):
            raise ValueError("M=%d routes to an expert the dump lacks" % M)
        row = {"m": M, "experts_hit": int(torch.unique(ids).numel())}
        with torch.no_grad():
            want = layer_ref(x, ids, tw)
            err = (ymt - want).abs()
            rmax = want.abs().amax(dim=1, keepdim=True)
            bad = err > tol["abs_of_row_max"] * rmax + tol["rel"] * want.abs()
            bad |= ~torch.isfinite(ymt)
            nbad = int(bad.sum())
            row["check"] = {
                "status": "pass" if nbad == 0 else "fail",
                "bad_elements": nbad,
                "tokens_bad": int(bad.any(dim=1).sum()),
                "max_err_of_row_max": float((err / rmax.clamp_min(1e-30)).max()),
                "rel_l2": float((ymt - want).norm() / want.norm().clamp_min(1e-30)),
                "rule": "|moetune - fp32 a4w4 reference| <= %g max|row| + %g |value|"
                        % (tol["abs_of_row_max"], tol["rel"]),
            }
            failed |= nbad > 0
            ybf = layer_bf16(x, ids, tw)
            row["bf16_rel_l2_vs_moetune"] = float((ybf - ymt).norm() / ymt.norm().clamp_min(1e-30))
            del want, err, bad, ybf
            for _ in range(2):
                timed(layer_bf16, x, ids, tw)
            ts, spent = [], 0.0
            while len(ts) < 3 or (len(ts) < a.reps and spent < a.max_seconds * 1e3):
                ts.append(timed(layer_bf16, x, ids, tw))
                spent += ts[-1]
        ts.sort()
        row.update(peer_ms=statistics.median(ts), peer_ms_p10=ts[len(ts) // 10],
                   peer_ms_p90=ts[min(len(ts) - 1, (9 * len(ts)) // 10)], reps=len(ts))
        rows.append(row)
        print("M=%d: PyTorch %.3f ms (median of %d), check %s (max error %.2e of the row max)"
              % (M, row["peer_ms"], len(ts), row["check"]["status"],
                 row["check"]["max_err_of_row_max"]), file=sys.stderr)
    res.update(rows=rows, status="failed" if failed else "ok")
    if failed:
        res["reason"] = "moetune's output is outside the tolerance at some M (rows[].check)"
    emit(res, a.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
