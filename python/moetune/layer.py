"""layer.py: Device and MoeLayer, thin Python objects over libmoetune's
handles (moetune_device, moetune_moe). Buffers are passed by address (ints,
torch tensors, numpy arrays or ctypes objects); torch_ops.py has the
operator on tensors. The contracts are the C API's (include/moetune/): a
device and its layers are used by one thread at a time; a layer keeps
using its weight buffers, so a MoeLayer keeps the objects it was given."""
import ctypes

from . import _capi
from ._capi import lib


class Device:
    """A device ("cpu", "emu", "hip:0", "cuda:0", "auto") and the tuned
    databases it reads, searched in order (the user's first, a shipped one
    after it)."""

    def __init__(self, spec="cpu", dbs=()):
        self._h = ctypes.c_void_p()
        status = lib.moetune_device_open(spec.encode(), ctypes.byref(self._h))
        if status != 0:
            try:
                _capi.check(status, self._h)
            finally:
                lib.moetune_device_close(self._h)
                self._h = None
        for path in dbs:
            self.add_db(path)

    def add_db(self, path):
        _capi.check(lib.moetune_device_add_db(self._h, str(path).encode()), self._h)

    @property
    def info(self):
        i = _capi.DeviceInfo()
        _capi.check(lib.moetune_device_get_info(self._h, ctypes.byref(i)), self._h)
        return {"backend": _capi.BACKENDS[i.backend], "spec": i.spec.decode(),
                "arch": i.arch.decode(), "name": i.name.decode(),
                "compute_units": i.compute_units, "host_memory": bool(i.host_memory)}

    def synchronize(self):
        _capi.check(lib.moetune_device_synchronize(self._h), self._h)

    def close(self):
        """Gives up this object's hold; layers keep the device alive."""
        if self._h:
            lib.moetune_device_close(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class MoeLayer:
    """A MoE layer with MXFP4 experts in the checkpoint's (Quark) layout:
    w13 [E, 2I, H/2] (gate_proj rows, then up_proj rows, per expert), s13
    [E, 2I, H/32], w2 [E, H, I/2], s2 [E, H, I/32]; the shared expert's the
    same with one expert of width shared_inter. gate (bf16 [E, H]) for
    routing="gate", bias (f32 [E]) for "gate" and "logits".

    act: "a16w4", "a4w4" or "a8w4" (cpu). routing: "gate" (run), "logits"
    (run_logits, also run_topk) or "topk" (run_topk)."""

    def __init__(self, device, *, hidden, inter, experts, topk, w13, s13, w2, s2,
                 gate=None, bias=None, shared_w13=None, shared_s13=None, shared_w2=None,
                 shared_s2=None, shared_inter=0, n_group=1, topk_group=1, norm_topk=True,
                 routed_scale=1.0, act="a16w4", routing="gate", max_tokens=256):
        self.device = device  # the layer holds the device too; keep the object alive
        d = _capi.MoeDesc()
        lib.moetune_moe_desc_init(ctypes.byref(d))
        d.hidden, d.inter, d.experts, d.topk = hidden, inter, experts, topk
        d.n_group, d.topk_group, d.norm_topk = n_group, topk_group, int(bool(norm_topk))
        d.routed_scale, d.act, d.routing = routed_scale, _capi.ACT[act], _capi.ROUTING[routing]
        d.shared_inter, d.max_tokens = shared_inter, max_tokens
        self.desc = d
        self.routing = routing
        given = dict(gate=gate, bias=bias, w13=w13, s13=s13, w2=w2, s2=s2,
                     shared_w13=shared_w13, shared_s13=shared_s13, shared_w2=shared_w2,
                     shared_s2=shared_s2)
        self._weights = given  # the library may read them until the layer goes
        w = _capi.MoeWeights(**{k: _capi.address(v) for k, v in given.items()})
        self._h = ctypes.c_void_p()
        _capi.check(lib.moetune_moe_create(device._h, ctypes.byref(d), ctypes.byref(w),
                                           ctypes.byref(self._h)), device._h)

    def _check(self, status):
        _capi.check(status, self.device._h)

    def run(self, x, m, y, stream=None):
        """ROUTE_GATE: y (f32 [m, H]) = layer(x bf16 [m, H]); addresses."""
        self._check(lib.moetune_moe_run(self._h, _capi.address(x), m, _capi.address(y), stream))

    def run_logits(self, x, logits, m, y, stream=None):
        """ROUTE_LOGITS: routed by bf16 logits [m, E]."""
        self._check(lib.moetune_moe_run_logits(self._h, _capi.address(x), _capi.address(logits),
                                               m, _capi.address(y), stream))

    def run_topk(self, x, topk_ids, topk_weights, m, y, stream=None):
        """ROUTE_TOPK (and ROUTE_LOGITS): int32 ids and f32 weights [m, topk]."""
        self._check(lib.moetune_moe_run_topk(self._h, _capi.address(x), _capi.address(topk_ids),
                                             _capi.address(topk_weights), m,
                                             _capi.address(y), stream))

    def selection(self):
        """Per kernel and token-count bucket: what runs and where it came from."""
        out = []
        s = _capi.Selection()
        for i in range(lib.moetune_moe_selection_count(self._h)):
            self._check(lib.moetune_moe_selection(self._h, i, ctypes.byref(s)))
            out.append({"kernel": s.kernel.decode(), "use": s.use.decode(),
                        "shape": s.shape.decode(), "config": s.config.decode(),
                        "db": s.db.decode() if s.db else None, "note": s.note.decode(),
                        "m": s.m, "tuned_m": s.tuned_m,
                        "source": lib.moetune_source_str(s.source).decode(),
                        "is_default": bool(s.is_default)})
        return out

    def report(self):
        """The selection as the runtime prints it, with a summary line."""
        return lib.moetune_moe_report(self._h).decode()

    def close(self):
        if getattr(self, "_h", None):
            lib.moetune_moe_destroy(self._h)
            self._h = None

    def __del__(self):
        self.close()
