"""moetune: Python binding of libmoetune (ctypes, no compiled extension).

    import moetune
    dev = moetune.Device("cpu", dbs=["my-tuned.db"])
    layer = moetune.MoeLayer(dev, hidden=..., inter=..., experts=..., topk=...,
                             w13=..., s13=..., w2=..., s2=..., routing="logits")
    y = moetune.moe(x, router_logits, layer)      # torch tensors
    print(layer.report())

The library is found through $MOETUNE_LIBRARY, next to an installed
package (<prefix>/lib), or on the loader's path. docs/LIBRARY.md has more."""
from ._capi import API_VERSION, MoetuneError, lib as _lib
from .layer import Device, MoeLayer


def version():
    """The library's release and API version, e.g. "0.1.0 (api 1)"."""
    return _lib.moetune_version_string().decode()


def moe(x, router_logits_or_topk, layer):
    """The MoE layer as a PyTorch operator (torch_ops.moe; needs torch)."""
    from .torch_ops import moe as _moe
    return _moe(x, router_logits_or_topk, layer)


__all__ = ["API_VERSION", "Device", "MoeLayer", "MoetuneError", "moe", "version"]
