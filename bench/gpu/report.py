#!/usr/bin/env python3
"""report.py: bench/gpu-check.sh's results as one JSON document
(OUT/gpu-check.json) and a short text table (OUT/gpu-check.txt), from the
files its steps left in OUT. Standard library only; a missing or broken
input leaves its fields null (the table prints "-") and never stops the
report.

usage: report.py OUT [--ms 1,16,256,4096] [--arch sm_90]
"""
import argparse
import glob
import json
import os

# The attention calls the table always lists (bench_attn's decode-path
# items); bench_attn's other rows follow when present.
ATTN_ROWS = [("mla_decode", "glm5.2", 1), ("mla_decode", "glm5.2-dense", 1),
             ("mla_decode", "glm5.2-fp8", 1), ("mla_decode", "glm5.2", 6),
             ("dsa_indexer", "glm5.2", 1), ("dsa_indexer", "glm5.2-fp8", 1)]


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return rows


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def steps_of(out):
    steps = []
    for line in read_text(os.path.join(out, "steps.tsv")).splitlines():
        p = line.split("\t")
        if len(p) >= 3:
            try:
                secs = int(p[2])
            except ValueError:
                secs = None
            steps.append({"name": p[0], "status": p[1], "seconds": secs,
                          "note": p[3] if len(p) > 3 else ""})
    return steps


def fmt(v, spec="%.3f"):
    return "-" if v is None else spec % v


def ratio(a, b):
    return a / b if a is not None and b else None


def peer_doc(out):
    return read_json(os.path.join(out, "peer.json"))


def moe_section(out, ms):
    dflt = read_jsonl(os.path.join(out, "moe-default.jsonl"))
    tuned = read_jsonl(os.path.join(out, "moe-tuned.jsonl"))
    peer = read_json(os.path.join(out, "peer.json")) or {}
    prow = {r["m"]: r for r in peer.get("rows", [])}
    keys = next((r for r in dflt if r.get("stage") == "keys"), None)

    def find(rows, stage, m):
        return next((r for r in rows if r.get("stage") == stage and r.get("M") == m), None)

    rows = []
    for m in ms:
        lay, lt = find(dflt, "layer", m), find(tuned, "layer", m)
        up, down, p = find(dflt, "up", m), find(dflt, "down", m), prow.get(m)
        isa = {s: read_json(os.path.join(out, "moe-isa", "%s_%d.json" % (s, m)))
               for s in ("up", "down")}
        layer_ms = lay and lay.get("layer_ms")
        tuned_ms = lt and lt.get("layer_ms")
        peer_ms = p and p.get("peer_ms")

        def cfg(stage_row, s):
            if stage_row:
                return stage_row.get("best_config")
            return isa[s].get("config") if isa[s] else None

        rows.append({
            "m": m,
            "experts_hit": (lay and lay.get("experts")) or (p and p.get("experts_hit")),
            "layer_default_ms": layer_ms,
            "layer_default_ms_p10": lay and lay.get("layer_ms_p10"),
            "layer_default_ms_p90": lay and lay.get("layer_ms_p90"),
            "layer_tuned_ms": tuned_ms,
            "layer_tuned_configs": lt and lt.get("configs"),
            "up_ms": up and up.get("default_ms"),
            "down_ms": down and down.get("default_ms"),
            "up_config": cfg(up, "up"),
            "down_config": cfg(down, "down"),
            "up_compiled": isa["up"] is not None and not up,
            "down_compiled": isa["down"] is not None and not down,
            "layer_TFLOPs": lay and lay.get("GFLOPs") and lay["GFLOPs"] / 1000,
            "weight_GBps": lay and lay.get("weight_GBps"),
            "bw_GBps": lay and lay.get("mem_bw_GBps"),
            "of_bw": lay and lay.get("fraction_of_bw"),
            "up_of_bw": up and up.get("fraction_of_bw"),
            "down_of_bw": down and down.get("fraction_of_bw"),
            "pytorch_ms": peer_ms,
            "moetune_over_pytorch": ratio(layer_ms, peer_ms),
            "tuned_over_pytorch": ratio(tuned_ms, peer_ms),
            "peer_check": p and p.get("check"),
            "pytorch_bf16_rel_l2": p and p.get("bf16_rel_l2_vs_moetune"),
        })
    return {"shape": "glm5.2", "keys": keys and keys.get("kernels"),
            "peer_status": peer.get("status"), "peer_reason": peer.get("reason"),
            "peer_device": peer.get("device"), "experts_dumped": peer.get("experts_dumped"),
            "rows": rows}


def attention_section(out):
    timed = [r for r in read_jsonl(os.path.join(out, "attn.jsonl")) if "family" in r]
    limits = next((r["limits"] for r in read_jsonl(os.path.join(out, "attn.jsonl"))
                   if "limits" in r), None)
    checks = {}
    for path in glob.glob(os.path.join(out, "attn-check", "*.json")):
        parts = os.path.basename(path)[:-5].rsplit("_", 2)  # family_shape_M
        if len(parts) == 3:
            doc = read_json(path)
            res = (doc or {}).get("results", [])
            dflt = next((r for r in res if r.get("default")), res[0] if res else None)
            checks[(parts[0], parts[1], int(parts[2]))] = {
                "status": ("failed" if not doc or doc.get("failed") else
                           "compiled" if dflt and dflt.get("status") == "compiled" else "passed"),
                "config": dflt and dflt.get("config"),
            }
    want = list(ATTN_ROWS)
    for r in timed:
        k = (r["family"], r["shape"], r["M"])
        if k not in want:
            want.append(k)
    rows = []
    for k in want:
        t = next((r for r in timed if (r["family"], r["shape"], r["M"]) == k), None)
        c = checks.get(k)
        rows.append({"family": k[0], "shape": k[1], "m": k[2],
                     "config": (t and t.get("config")) or (c and c.get("config")),
                     "ms": t and t.get("ms_best"), "ms_median": t and t.get("ms_median"),
                     "GBps": t and t.get("GBps"), "of_bw": t and t.get("of_bw"),
                     "GFLOPs": t and t.get("GFLOPs"), "of_peak": t and t.get("of_peak"),
                     "bound": t and t.get("bound"), "check": c and c.get("status")})
    return {"limits": limits, "rows": rows}


def check_section(out):
    fams = []
    # A family's .err exists from its start, its .rc from its end: one
    # without .rc was stopped (the step's time cap).
    for path in sorted(glob.glob(os.path.join(out, "check", "*.err"))):
        name = os.path.basename(path)[:-4]
        rc = read_text(os.path.join(out, "check", name + ".rc"))
        if not rc:
            fams.append({"family": name, "exit": None, "passed": None, "failed": None,
                         "refused": None, "status": "stopped",
                         "note": "not finished when the step's time cap ended it"})
            continue
        doc = read_json(os.path.join(out, "check", name + ".json"))
        err = read_text(os.path.join(out, "check", name + ".err")).splitlines()
        row = {"family": name, "exit": int(rc) if rc.lstrip("-").isdigit() else None,
               "passed": doc and doc.get("passed"), "failed": doc and doc.get("failed"),
               "refused": doc and doc.get("refused")}
        row["status"] = "ok" if row["exit"] == 0 else "failed"
        if row["exit"] != 0:
            bad = [r for r in (doc or {}).get("results", [])
                   if r.get("status") not in ("passed", "compiled", "refused")]
            row["note"] = ("; ".join("%s M=%s %s: %s" % (r.get("shape"), r.get("m"),
                                                         r.get("config"), r.get("status"))
                                     for r in bad[:3]) or (err[-1] if err else ""))
        fams.append(row)
    seen = {f["family"] for f in fams}
    for name in read_text(os.path.join(out, "check", "families.txt")).split():
        if name not in seen:
            fams.append({"family": name, "exit": None, "passed": None, "failed": None,
                         "refused": None, "status": "stopped",
                         "note": "not started before the step's time cap"})
    total = {k: sum((f.get(k) or 0) for f in fams) for k in ("passed", "failed", "refused")}
    status = (None if not fams else "ok" if all(f["status"] == "ok" for f in fams) else
              "stopped" if all(f["status"] in ("ok", "stopped") for f in fams) else "failed")
    return dict(total, status=status, families=fams)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--ms", default="1,16,256,4096")
    ap.add_argument("--arch", default="sm_90")
    a = ap.parse_args()
    out = a.out
    ms = [int(x) for x in a.ms.split(",") if x]
    mode = read_text(os.path.join(out, "mode")) or "none"
    elapsed = read_text(os.path.join(out, "elapsed")).replace("elapsed", "").strip()
    devs = read_json(os.path.join(out, "devices.json")) or []
    gpu = next((d for d in devs if d.get("backend") == "cuda"), None)
    peak = read_json(os.path.join(out, "peak.json")) or {}
    steps = steps_of(out)
    moe = moe_section(out, ms)
    attn = attention_section(out)
    chk = check_section(out)
    nccl = next((s for s in steps if s["name"] == "nccl"), None)
    lim = attn["limits"] or {}
    bw = max([x for x in [lim.get("bw_GBps")] + [r["bw_GBps"] for r in moe["rows"]] if x] or
             [0]) or None
    doc = {
        "format": 1,
        "mode": mode,
        "arch": gpu.get("arch") if gpu else a.arch,
        "device": gpu,
        "elapsed_s": int(elapsed) if elapsed.isdigit() else None,
        "steps": steps,
        "limits": {"bw_GBps": bw, "read_kernel_GBps": lim.get("read_kernel_GBps") or None,
                   "copy_kernel_GBps": lim.get("copy_kernel_GBps") or None,
                   "bw_probe": lim.get("probe"),
                   "bf16_tflops": peak.get("tflops_best"),
                   "bf16_tflops_median": peak.get("tflops_median"),
                   "bf16_peak_status": peak.get("status"),
                   "bf16_peak_reason": peak.get("reason")},
        "check": chk,
        "moe": moe,
        "attention": {"rows": attn["rows"]},
        "nccl": {"status": nccl["status"] if nccl else None,
                 "note": nccl["note"] if nccl else None,
                 "log": read_text(os.path.join(out, "logs", "nccl.log")).splitlines()[-12:]},
    }
    for r in moe["rows"]:
        r["of_bf16_peak"] = ratio(r["layer_TFLOPs"], peak.get("tflops_best"))
    with open(os.path.join(out, "gpu-check.json"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")

    L = []
    where = ("%s (%s)" % (gpu.get("name"), gpu.get("arch")) if gpu else
             "no GPU: compile-only, NVRTC for %s" % a.arch if mode == "compile-only" else
             "no moetune binary")
    L.append("gpu-check: %s mode, %s, %s s" % (mode, where, doc["elapsed_s"]))
    L.append("")
    L.append("steps")
    L.append("  %-12s %-8s %5s  %s" % ("step", "status", "s", "note"))
    for s in steps:
        L.append("  %-12s %-8s %5s  %s" % (s["name"], s["status"], fmt(s["seconds"], "%d"),
                                           s["note"][:110]))
    L.append("")
    li = doc["limits"]
    L.append("limits (same run): memory %s GB/s (read kernel %s, copy kernel %s); bf16 matmul "
             "%s TFLOP/s (torch.matmul 8192^3)%s" % (
                 fmt(li["bw_GBps"], "%.0f"), fmt(li["read_kernel_GBps"], "%.0f"),
                 fmt(li["copy_kernel_GBps"], "%.0f"), fmt(li["bf16_tflops"], "%.0f"),
                 "" if li["bf16_tflops"] else ": " + (li["bf16_peak_reason"] or "not run")))
    L.append("")
    L.append("MoE layer, glm5.2 (E 256, top-8, H 6144, I 2048, a4w4), per M; ms by CUDA events")
    L.append("  %5s %7s %9s %9s %8s %8s %7s %6s %6s %10s %9s %6s" % (
        "M", "experts", "layer ms", "tuned ms", "up ms", "down ms", "GB/s", "of bw", "TF/s",
        "PyTorch ms", "mt/torch", "check"))
    for r in moe["rows"]:
        pc = r["peer_check"]
        L.append("  %5d %7s %9s %9s %8s %8s %7s %6s %6s %10s %9s %6s" % (
            r["m"], fmt(r["experts_hit"], "%.1f"), fmt(r["layer_default_ms"]),
            fmt(r["layer_tuned_ms"]), fmt(r["up_ms"]), fmt(r["down_ms"]),
            fmt(r["weight_GBps"], "%.0f"), fmt(r["of_bw"], "%.2f"),
            fmt(r["layer_TFLOPs"], "%.0f"), fmt(r["pytorch_ms"]),
            fmt(r["moetune_over_pytorch"], "%.2f"), pc["status"] if pc else "-"))
    L.append("  stage default configs%s:" % (" (compiled, not timed)" if mode != "gpu" else ""))
    for r in moe["rows"]:
        L.append("  %5d up %s | down %s" % (r["m"], r["up_config"] or "-", r["down_config"] or "-"))
    if moe["peer_status"] == "ok":
        L.append("  PyTorch peer on %s: %s of %s experts dumped (every expert a dumped M hit), "
                 "bf16 weights" % (moe["peer_device"], moe["experts_dumped"],
                                   (peer_doc(out) or {}).get("n_experts")))
    elif moe["peer_status"]:
        L.append("  PyTorch peer: %s %s" % (moe["peer_status"], moe["peer_reason"] or ""))
    L.append("")
    L.append("attention at GLM-5.2 dims (best of the timed calls, L2 flushed)")
    L.append("  %-12s %-13s %3s %9s %8s %6s %8s  %s" % ("family", "shape", "M", "ms", "GB/s",
                                                     "of bw", "check", "config"))
    for r in attn["rows"]:
        L.append("  %-12s %-13s %3d %9s %8s %6s %8s  %s" % (
            r["family"], r["shape"], r["m"], fmt(r["ms"], "%.4f"), fmt(r["GBps"], "%.0f"),
            fmt(r["of_bw"], "%.2f"), r["check"] or "-", r["config"] or "-"))
    L.append("")
    ok_word = "passed" if mode == "gpu" else "compiled"
    L.append("check (moetune check --device cuda%s): %s %s, %s failed, %s cases refused" % (
        "" if mode == "gpu" else " --arch " + a.arch, chk["passed"], ok_word, chk["failed"],
        chk["refused"]))
    for f in chk["families"]:
        L.append("  %-14s %-7s %4s %s %3s failed %3s refused%s" % (
            f["family"], f["status"], fmt(f["passed"], "%d"), ok_word, fmt(f["failed"], "%d"),
            fmt(f["refused"], "%d"), "  " + f["note"][:80] if f.get("note") else ""))
    L.append("")
    L.append("NCCL (one rank, device buffers): %s%s" % (
        doc["nccl"]["status"] or "-", ": " + doc["nccl"]["note"] if doc["nccl"]["note"] else ""))
    with open(os.path.join(out, "gpu-check.txt"), "w") as f:
        f.write("\n".join(L) + "\n")
    print("wrote gpu-check.json and gpu-check.txt in %s" % out)


if __name__ == "__main__":
    main()
