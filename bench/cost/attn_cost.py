#!/usr/bin/env python3
"""attn_cost.py: the cost model of GLM-5.2's decode attention on GPUs
(mla_decode over the sparse top-k and the dsa_indexer over the whole
context), from the gfx942 code objects of the families' defaults.

    python3 bench/cost/attn_cost.py build/moetune [OLD_BINARY]

prints a markdown table: per context length, batch and GPU, the HBM time
and the model's time as a range (VALU and matrix work overlapped to
serialized), as a fraction of HBM time. Each binary is asked for its
default config and the instruction counts of its code objects
(`moetune isa --json`; gfx942 through clang-19, no GPU needed).
An estimate, not a measurement: latency is not in it."""
import json, math, os, subprocess, sys, tempfile

H, L, R, TOPK, IH, ID = 64, 512, 64, 2048, 32, 128  # GLM-5.2, one device
W = L + R
GPUS = {  # CUs or SMs, clock, HBM bytes/s, dense fp8 flop/s, lanes a CU issues a cycle
    'MI300X': dict(cu=304, f=2.1e9, bw=5.3e12, fp8=2.6e15, lanes=64),
    'MI355X': dict(cu=256, f=2.4e9, bw=8.0e12, fp8=5.0e15, lanes=64),
    'H100': dict(cu=132, f=1.98e9, bw=3.35e12, fp8=1.979e15, lanes=128, nv=True),
    'H200': dict(cu=132, f=1.98e9, bw=4.8e12, fp8=1.979e15, lanes=128, nv=True),
}
for _name, _t in GPUS.items():
    _t['name'] = _name
CACHE = tempfile.mkdtemp(prefix='moetune-cost-')


def isa(binary, fam, m, kernel):
    env = dict(os.environ, MOETUNE_CACHE=CACHE)
    out = subprocess.run([binary, 'isa', '--family', fam, '--shape', 'glm5.2-fp8', '--m',
                          str(m), '--arch', 'gfx942', '--json'], capture_output=True, text=True,
                         env=env, check=True).stdout
    d = json.loads(out)
    cfg = {k: int(v) for k, v in (kv.split('=') for kv in d['config'].split(','))}
    return cfg, next(k for k in d['kernels'] if k['name'] == kernel)


def mma_time(t, n_instr, mma):
    """n_instr matrix instructions: 16x16x16 bf16 (MMA 1) or 16x16x32 fp8
    (MMA 3) take 16 cycles on one of a CU's 4 SIMDs (gfx942; MI355X at the
    same rate per CU for these instructions); NVIDIA mma.sync at 2/3 of
    the dense peak, bf16 at half of fp8."""
    if t.get('nv'):
        flops = n_instr * (8192 if mma == 1 else 16384)
        per_sm = t['fp8'] / GPUS[t['name']]['cu']
        return flops / (per_sm * t['cu'] * 2 / 3 * (0.5 if mma == 1 else 1))
    return n_instr * 16 / 4 / t['cu'] / t['f']


def valu_time(t, wave_instr):
    return wave_instr * 64 / t['lanes'] / t['cu'] / t['f']


def pick_split(b, blocks_per_split, cu):
    """fam_mla_decode.c's default split of the top-k rows on a GPU of cu
    compute units (the code objects come from a compile-only device, 0 CUs)."""
    split = 1
    while split < 64 and blocks_per_split * b * split < 2 * cu and TOPK // (split * 2) >= 64:
        split *= 2
    return split


def mla_decode(binary, b, c, t):
    """Per 32-token tile of HB heads: the matrix instructions by the
    algorithm (MMA 1: Q K^T on bf16, P V with P in two bf16 parts; MMA 3:
    the query in two e4m3 parts, P in three), the VALU of the tile loop
    (static count; the old path's inner loop scaled by its trip count).
    A block's tiles run one after another on one CU: the call takes at
    least one block's time (what bounds a small batch)."""
    cfg, k = isa(binary, 'mla_decode', b, 'mla_decode_split')
    hb, bn, waves, mma = cfg['HB'], cfg['BN'], cfg['WAVES'], cfg['MMA']
    items = min(c, TOPK)
    cfg['NSPLIT'] = pick_split(b, H // hb, t['cu'])
    tiles_per_block = math.ceil(items / cfg['NSPLIT'] / bn)
    blocks = b * (H // hb) * cfg['NSPLIT']
    if mma == 3:
        per_tile = (2 * hb * bn * W + 3 * hb * L * bn) // 8192
    else:
        per_tile = (hb * bn * W + 2 * hb * L * bn) // 4096
    hot = k['hot_loop']
    trips = per_tile / (hot['mfma'] * waves) if hot['mfma'] else 1
    valu_tile = waves * hot['valu'] * trips
    hbm = b * items * W * (H // hb) / t['bw']
    one = dict(t, cu=1)
    block = (valu_time(one, tiles_per_block * valu_tile),
             mma_time(one, tiles_per_block * per_tile, mma))
    return hbm, valu_time(t, blocks * tiles_per_block * valu_tile), \
        mma_time(t, blocks * tiles_per_block * per_tile, mma), block, cfg


def dsa_indexer(binary, b, c, t):
    """Per block of BT keys and one query: 2 (query parts, MMA 3) or 1
    (bf16) matrix instructions per 16 heads x 16 keys x 32 dims (16 x 8 on
    NVIDIA: the same flops), the whole score kernel's static VALU per
    wave (its loops run once a block at the M=1 default)."""
    cfg, k = isa(binary, 'dsa_indexer', 1, 'dsa_scores')
    bt, waves, mma = cfg['BT'], cfg['WAVES'], cfg['MMA']
    blocks = b * math.ceil(c / bt)
    per_block = (2 if mma == 3 else 1) * IH * bt * ID // (16 * 16 * 32)
    if mma != 3:
        per_block *= 2  # 16x16x16 bf16: half the K a instruction
    hbm = b * c * (ID + 4 * 5) / t['bw']  # keys, the score written and read by the top-k
    one = dict(t, cu=1)
    block = (valu_time(one, waves * k['all']['valu']), mma_time(one, per_block, mma))
    return hbm, valu_time(t, blocks * waves * k['all']['valu']), \
        mma_time(t, blocks * per_block, mma), block, cfg


def row(fn, binary, b, c, t):
    hbm, valu, mm, (bv, bm), cfg = fn(binary, b, c, t)
    lo, hi = max(hbm, valu, mm, bv, bm), max(hbm, valu + mm, bv + bm)
    bound = 'HBM' if hbm >= max(valu, mm, bv, bm) else \
        ('one block' if max(bv, bm) > max(valu, mm) else 'VALU' if valu >= mm else 'matrix')
    if lo == hi:
        return f"{lo * 1e6:.1f} us, {hbm / lo:.0%} ({bound})", cfg
    return f"{lo * 1e6:.1f}-{hi * 1e6:.1f} us, {hbm / hi:.0%}-{hbm / lo:.0%} ({bound})", cfg


def main():
    new = sys.argv[1]
    old = sys.argv[2] if len(sys.argv) > 2 else None
    for name, fn in (('mla_decode', mla_decode), ('dsa_indexer', dsa_indexer)):
        print(f"\n{name}: time, fraction of HBM time (what bounds it)\n")
        head = '| C | B | GPU | HBM time |' + (' old |' if old else '') + ' new |'
        print(head)
        print('|' + ' --- |' * (head.count('|') - 1))
        cfgs = set()
        for c in (4096, 32768, 131072):
            for b in (1, 64, 256):
                for g, t in GPUS.items():
                    hbm = fn(new, b, c, t)[0]
                    cells = []
                    for binary in ([old] if old else []) + [new]:
                        text, cfg = row(fn, binary, b, c, t)
                        cells.append(text)
                        cfgs.add((binary == new, tuple(sorted(cfg.items()))))
                    print(f"| {c // 1024}k | {b} | {g} | {hbm * 1e6:.1f} us | " +
                          ' | '.join(cells) + ' |')
        for is_new, cfg in sorted(cfgs):
            print(f"\n{'new' if is_new else 'old'} config: " +
                  ','.join(f'{k}={v}' for k, v in cfg))


if __name__ == '__main__':
    main()
