#!/usr/bin/env python3
"""moe_cost.py: the cost model of GLM-5.2's MoE expert GEMMs (a4w4, up +
down, one call each) on GPUs, from the gfx942 code objects of the
families' defaults (`moetune isa --json`; clang-19, no GPU needed).

    python3 bench/cost/moe_cost.py build/moetune

prints, per M and GPU, the HBM time, the model's time as a range (VALU
and matrix work overlapped to serialized), its fraction of HBM time and
the flop rate; docs/BENCHMARKS.md ("MoE cost model") gives the arithmetic.
An estimate, not a measurement: latency is not in it."""
import json, math, os, subprocess, sys, tempfile
CACHE = tempfile.mkdtemp(prefix='moetune-cost-')
E, TOPK, H, I = 256, 8, 6144, 2048
def isa(binary, fam, m):
    out = subprocess.run([binary,'isa','--family',fam,'--shape','glm5.2','--m',str(m),'--arch','gfx942','--json'],capture_output=True,text=True,env=dict(os.environ,MOETUNE_CACHE=CACHE),check=True).stdout
    d = json.loads(out)
    cfg = dict(kv.split('=') for kv in d['config'].split(','))
    cfg = {k:int(v) for k,v in cfg.items()}
    k = [x for x in d['kernels'] if x['name']==fam][0]
    return cfg, k['hot_loop'], k
def binom_pmf(n, p):
    # returns list of pmf for k around mean
    lo=0; hi=n
    mu=n*p; sd=math.sqrt(n*p*(1-p))
    lo=max(0,int(mu-12*sd-5)); hi=min(n,int(mu+12*sd+5))
    lg=lambda x: math.lgamma(x+1)
    return [(k, math.exp(lg(n)-lg(k)-lg(n-k)+k*math.log(p)+(n-k)*math.log(1-p))) for k in range(lo,hi+1)]
def exp_tiles(m, bm):
    n=m*TOPK; p=1.0/E
    return E*sum(pr*math.ceil(k/bm) for k,pr in binom_pmf(n,p))
def exp_segs(m):
    return E*(1-(1-TOPK/E)**m)
targets = {
 'MI300X': dict(cu=304, f=2.1e9, bw=5.3e12, lanes=64, simd=4, c_fp8=16, c_bf16_16=16, c_bf16_32=32, peak8=2.6e15),
 'MI355X': dict(cu=256, f=2.4e9, bw=8.0e12, lanes=64, simd=4, c_fp8=16, c_bf16_16=16, c_bf16_32=32, peak8=5.0e15),
 'H100':  dict(cu=132, f=1.98e9, bw=3.35e12, lanes=128, simd=4, nv=True, peak8=1.979e15),
 'H200':  dict(cu=132, f=1.98e9, bw=4.8e12, lanes=128, simd=4, nv=True, peak8=1.979e15),
}
def mfma_flops(kind):
    return {'fp8':16384,'bf16_16':8192,'bf16_32':16384}[kind]
def stage(binary, fam, m, t):
    cfg, hot, k = isa(binary, fam, m)
    up = fam=='moe_gemm_up'
    K = H if up else I; N = I if up else H; wr = 2 if up else 1
    waves = cfg['WAVES']; sk = cfg['SPLITK']
    mma = cfg['MMA']; gemv = cfg['GEMV']
    kind = 'fp8' if mma==3 else ('bf16_32' if mma==2 else 'bf16_16')
    hm, hv = hot['mfma'], hot['valu']
    if gemv:
        segs = min(m*TOPK, E) if m*TOPK < E else exp_segs(m)
        segs = exp_segs(m)
        blocks = segs * (N/cfg['BN']) * sk
        if mma==3:
            steps = K/sk/128; iters = steps/cfg['UNROLL']
        else:
            # old bf16 GEMV: the hot loop is one row-slot pass (count it per block: rows per wave...)
            iters = None
    else:
        blocks = exp_tiles(m, cfg['BM']) * (N/cfg['BN']) * sk
        iters = K/sk/cfg['BK']
    if iters is None:
        return None
    wave_iters = blocks*waves*iters
    valu_lane_ops = wave_iters*hv*64           # lane operations
    mfma_n = wave_iters*hm
    if t.get('nv'):
        valu_cyc = valu_lane_ops/(t['lanes']*t['cu'])
        # mma.sync at 2/3 of the dense fp8 peak (bf16 half of that)
        rate = t['peak8']*2/3*(1 if kind=='fp8' else 0.5)
        mfma_t = mfma_n*mfma_flops(kind)/rate
        valu_t = valu_cyc/t['f']
    else:
        valu_t = valu_lane_ops/(t['lanes']*t['cu'])/t['f']
        c = t['c_fp8'] if kind=='fp8' else t['c_bf16_32'] if kind=='bf16_32' else t['c_bf16_16']
        mfma_t = mfma_n*c/(t['simd']*t['cu'])/t['f']
    hit = exp_segs(m)
    wbytes = hit*wr*N*K*(0.5+1/32)
    abytes = (m if up else m*TOPK)*K*2 + (m*TOPK*N*2 if up else m*N*4)
    hbm_t = (wbytes+abytes)/t['bw']
    flops = 2*m*TOPK*wr*N*K
    return dict(cfg=cfg, hot=(hm,hv), hbm=hbm_t, valu=valu_t, mfma=mfma_t, flops=flops)
def main(binary):
  for m in [1,16,256,4096]:
      for tn,t in targets.items():
          rs=[stage(binary,f,m,t) for f in ('moe_gemm_up','moe_gemm_down')]
          if None in rs:
              print(m,tn,'n/a'); continue
          hbm=sum(r['hbm'] for r in rs)
          lo=sum(max(r['hbm'],r['valu'],r['mfma']) for r in rs)
          hi=sum(max(r['hbm'],r['valu']+r['mfma']) for r in rs)
          fl=sum(r['flops'] for r in rs)
          print(f"M={m:5d} {tn:7s} hbm {hbm*1e6:8.1f}us  est {lo*1e6:8.1f}-{hi*1e6:8.1f}us  HBM {hbm/hi*100:5.1f}-{hbm/lo*100:5.1f}%  {fl/hi/1e12:7.0f}-{fl/lo/1e12:7.0f} TF/s ({fl/hi/t['peak8']*100:4.1f}-{fl/lo/t['peak8']*100:4.1f}% fp8)  " + ' '.join(f"[{r['cfg']['MMA']},{r['cfg']['GEMV']} v{r['valu']*1e6:.0f} m{r['mfma']*1e6:.0f} h{r['hbm']*1e6:.0f}]" for r in rs))


if __name__ == '__main__':
    main(sys.argv[1])
