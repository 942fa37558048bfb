"""test_torch_moe.py: moetune.moe, the PyTorch operator, against a plain
PyTorch MoE written here (dequantize MXFP4, gather each expert's tokens,
matmul, SiLU gate, down, weighted combine, plus the shared expert) at
GLM-5.2's shape (hidden 6144, expert width 2048, 256 experts, top-8, one
shared expert of width 2048, sigmoid routing with a correction bias, scale
2.5), random weights, a few tokens, on the cpu backend (4 tokens) and the
GPU kernels on the emulator (2 tokens). Both routings a caller has: router
logits (routed by the library) and its own top-k ids and weights.

Tolerance: a16w4 (bf16 activations), the layer tests' rule: every output
within 1e-2 of its token's largest value (plus 1e-2 relative), and each
token's relative L2 error under 1e-2. A token whose k-th and (k+1)-th
biased scores lie within 1e-5 may legitimately route differently (float
vs double) and is skipped for logits routing.

Only the experts the tokens use are filled; the rest of the 5 GB of expert
weights stay untouched zero pages. Exits 77 (skipped) without torch.
Usage: python3 test_torch_moe.py (MOETUNE_LIBRARY and PYTHONPATH set by ctest)."""
import sys

try:
    import torch
except ImportError:
    print("test_torch_moe: torch is not installed (Debian: python3-torch); skipped")
    sys.exit(77)

import moetune

H, I, E, S, TOPK, SCALE = 6144, 2048, 256, 2048, 8, 2.5
E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6],
                    dtype=torch.float64)


def dequant(packed, scales):
    """MXFP4 in Quark's layout ([rows, K/2] low nibble first, E8M0 [rows, K/32])."""
    rows = packed.shape[0]
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(rows, -1).long()
    vals = E2M1[codes].reshape(rows, -1, 32)
    return (vals * torch.exp2(scales.double() - 127)[..., None]).reshape(rows, -1)


def random_mxfp4(gen, rows, k):
    base = 127 - round(torch.log2(torch.tensor(2.6 * k ** 0.5)).item())
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=gen)
    scales = (base - 1 + torch.randint(0, 3, (rows, k // 32), generator=gen)).to(torch.uint8)
    return packed, scales


def route(logits, bias):
    """GLM-5's routing from bf16 logits, in double: ids, weights, margin."""
    score = torch.sigmoid(logits.double())
    choice = score + bias.double()
    top = torch.topk(choice, TOPK + 1, dim=-1)  # ties: torch's order; margins catch them
    ids = top.indices[:, :TOPK]
    margin = top.values[:, TOPK - 1] - top.values[:, TOPK]
    w = score.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * SCALE
    return ids, w, margin


def expert(x, w13, s13, w2, s2, inter):
    """down(silu(gate x) * up x), the intermediate rounded to bf16 as stored."""
    gu = x.double() @ dequant(w13, s13).T
    g, u = gu[:, :inter].float(), gu[:, inter:].float()
    h = (torch.nn.functional.silu(g) * u).to(torch.bfloat16).double()
    return h @ dequant(w2, s2).T


def reference(x, ids, w, weights):
    """The plain MoE: the shared expert, then each used expert on its tokens."""
    y = expert(x, *weights["shared"], S)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        out = expert(x[tok], weights["w13"][e], weights["s13"][e], weights["w2"][e],
                     weights["s2"][e], I)
        y.index_add_(0, tok, out * w[tok, slot, None])
    return y


def check(name, got, want, skip):
    got = got.double()
    bad = []
    for t in range(want.shape[0]):
        if skip[t]:
            continue
        rowmax = want[t].abs().max()
        err = (got[t] - want[t]).abs()
        rel_l2 = ((got[t] - want[t]).norm() / want[t].norm()).item()
        if not bool((err <= 1e-2 * rowmax + 1e-2 * want[t].abs()).all()) or rel_l2 > 1e-2:
            bad.append((t, (err.max() / rowmax).item(), rel_l2))
    print(f"test_torch_moe: {name}: {len(bad)} of {want.shape[0]} tokens off"
          f"{' (skipped near ties: %d)' % int(skip.sum()) if skip.any() else ''}")
    assert not bad, f"{name}: tokens off (token, max error / row max, rel L2): {bad}"


def run(spec, m, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, H, generator=gen)).to(torch.bfloat16)
    gate = (torch.randn(E, H, generator=gen) * 2 / H ** 0.5).to(torch.bfloat16)
    bias = (torch.rand(E, generator=gen) - 0.5) * 0.2
    logits = (x.float() @ gate.float().T).to(torch.bfloat16)
    ids, w, margin = route(logits, bias)
    # Full-size expert tensors, filled only where the tokens go.
    weights = {"w13": torch.empty(E, 2 * I, H // 2, dtype=torch.uint8),
               "s13": torch.empty(E, 2 * I, H // 32, dtype=torch.uint8),
               "w2": torch.empty(E, H, I // 2, dtype=torch.uint8),
               "s2": torch.empty(E, H, I // 32, dtype=torch.uint8)}
    for e in ids.unique().tolist():
        weights["w13"][e], weights["s13"][e] = random_mxfp4(gen, 2 * I, H)
        weights["w2"][e], weights["s2"][e] = random_mxfp4(gen, H, I)
    weights["shared"] = random_mxfp4(gen, 2 * S, H) + random_mxfp4(gen, H, S)

    dev = moetune.Device(spec)
    sw13, ss13, sw2, ss2 = weights["shared"]
    layer = moetune.MoeLayer(dev, hidden=H, inter=I, experts=E, topk=TOPK,
                             w13=weights["w13"], s13=weights["s13"], w2=weights["w2"],
                             s2=weights["s2"], bias=bias, shared_w13=sw13, shared_s13=ss13,
                             shared_w2=sw2, shared_s2=ss2, shared_inter=S,
                             routed_scale=SCALE, routing="logits", max_tokens=m)
    want = reference(x, ids, w, weights)
    y = moetune.moe(x, logits, layer)
    assert y.dtype == torch.float32 and tuple(y.shape) == (m, H)
    check(f"{spec} router logits", y, want, margin < 1e-5)
    y = moetune.moe(x, (ids, w.float()), layer)
    check(f"{spec} top-k ids and weights", y, want, torch.zeros(m, dtype=torch.bool))

    sel = layer.selection()
    kernels = {s["kernel"] for s in sel}
    assert {"moe_route", "moe_align", "moe_gemm_up", "moe_gemm_down",
            "moe_combine"} <= kernels, kernels
    assert all(s["source"] == "default" and s["is_default"] for s in sel), sel
    assert "summary:" in layer.report()
    print(layer.report().splitlines()[-1])
    layer.close()
    dev.close()


if __name__ == "__main__":
    seed = int(torch.randint(0, 2 ** 31, ()).item())
    print(f"test_torch_moe: seed {seed}")
    run("cpu", 4, seed)
    run("emu", 2, seed + 1)
    print("test_torch_moe: ok")
