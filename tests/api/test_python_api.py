"""test_python_api.py: the ctypes binding (python/moetune/) without torch:
the version, errors as MoetuneError with the library's message, device
info, a small layer on ctypes buffers (all three routings agree on the same
routing; zero expert weights give zeros), its selection, and handles
released in either order. Usage: run_python.sh LIB test_python_api.py."""
import ctypes
import random
import struct

import moetune

H, I, E, K, M = 256, 128, 16, 4, 3


def buf(n, fill=None):
    b = (ctypes.c_uint8 * n)()
    if fill is not None:
        for i in range(n):
            b[i] = fill(i)
    return b


def bf16(v):
    return struct.unpack("<I", struct.pack("<f", v))[0] >> 16


def main():
    assert moetune.API_VERSION == 1
    assert "api 1" in moetune.version(), moetune.version()
    try:
        moetune.Device("tpu")
        raise AssertionError("opened a tpu")
    except moetune.MoetuneError as e:
        assert e.status_name == "invalid" and "tpu" in str(e), e
    dev = moetune.Device("cpu")
    info = dev.info
    assert info["backend"] == "cpu" and info["host_memory"] and info["compute_units"] > 0, info
    try:
        dev.add_db("/nonexistent/tuned.db")
        raise AssertionError("opened a missing database")
    except moetune.MoetuneError as e:
        assert "/nonexistent/tuned.db" in str(e), e

    rnd = random.Random(5)
    w13 = buf(E * 2 * I * H // 2, lambda i: rnd.randrange(256))
    s13 = buf(E * 2 * I * H // 32, lambda i: 118 + rnd.randrange(3))
    w2 = buf(E * H * I // 2, lambda i: rnd.randrange(256))
    s2 = buf(E * H * I // 32, lambda i: 119 + rnd.randrange(3))
    x = (ctypes.c_uint16 * (M * H))(*[bf16(rnd.gauss(0, 1)) for _ in range(M * H)])
    logits = (ctypes.c_uint16 * (M * E))(*[bf16(rnd.gauss(0, 1)) for _ in range(M * E)])
    y1, y2 = (ctypes.c_float * (M * H))(), (ctypes.c_float * (M * H))()
    try:
        moetune.MoeLayer(dev, hidden=100, inter=I, experts=E, topk=K, w13=w13, s13=s13,
                         w2=w2, s2=s2, routing="topk")
        raise AssertionError("made a layer of hidden 100")
    except moetune.MoetuneError as e:
        assert "desc.hidden" in str(e), e
    layer = moetune.MoeLayer(dev, hidden=H, inter=I, experts=E, topk=K, w13=w13, s13=s13,
                             w2=w2, s2=s2, routing="logits", routed_scale=2.5, max_tokens=8)
    layer.run_logits(x, logits, M, y1)
    assert all(v == v for v in y1) and any(v != 0 for v in y1)
    # The routing the logits give, applied as given, is the same layer.
    ids = (ctypes.c_int32 * (M * K))()
    tw = (ctypes.c_float * (M * K))()
    for t in range(M):
        lg = [struct.unpack("<f", struct.pack("<I", logits[t * E + e] << 16))[0]
              for e in range(E)]
        score = [1 / (1 + 2.718281828459045 ** -v) for v in lg]
        top = sorted(range(E), key=lambda e: (-score[e], e))[:K]
        total = sum(score[e] for e in top)
        for j, e in enumerate(top):
            ids[t * K + j], tw[t * K + j] = e, score[e] / total * 2.5
    layer.run_topk(x, ids, tw, M, y2)
    worst = max(abs(a - b) for a, b in zip(y1, y2))
    scale = max(abs(v) for v in y1)
    assert worst <= 1e-5 * scale, (worst, scale)
    try:
        layer.run(x, M, y1)
        raise AssertionError("ran a logits layer by its router weight")
    except moetune.MoetuneError as e:
        assert e.status_name == "misuse" and "ROUTE_LOGITS" in str(e), e

    sel = layer.selection()
    assert len(sel) == 5 * 4, len(sel)  # five kernels at buckets 1, 2, 4, 8
    assert {s["use"] for s in sel} == {"router logits", "expert sort", "experts up",
                                       "experts down", "combine"}, sel
    assert all(s["source"] == "default" for s in sel), sel
    assert layer.report().splitlines()[-1].startswith("summary:")

    zero = moetune.MoeLayer(dev, hidden=H, inter=I, experts=E, topk=K, w13=buf(len(w13)),
                            s13=s13, w2=buf(len(w2)), s2=s2, routing="topk", max_tokens=8)
    zero.run_topk(x, ids, tw, M, y2)
    assert all(v == 0 for v in y2)
    dev.close()  # the layers hold the device
    layer.run_logits(x, logits, M, y2)
    zero.close()
    layer.close()
    print("test_python_api: ok")


if __name__ == "__main__":
    main()
