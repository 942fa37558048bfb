"""torch_ops.py: moetune.moe, the MoE layer as a PyTorch operator on
torch.Tensors, over MoeLayer. CPU tensors for a cpu or emu device; CUDA (or
ROCm) tensors for a cuda or hip device, on the current stream when that is
the device's default stream (a side stream is refused by this version of
the library rather than raced)."""
import torch


def _aligned(t, dtype):
    """t as a contiguous tensor of dtype whose data is 16-byte aligned."""
    t = t.to(dtype).contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def moe(x, router_logits_or_topk, layer):
    """y = layer(x) for x [M, H] (converted to bf16), routed by

      - router logits [M, E] (converted to bf16) on a routing="logits" layer,
      - a pair (topk_ids [M, topk], topk_weights [M, topk]) on a "logits" or
        "topk" layer, the weights applied as given,
      - None on a routing="gate" layer (the layer's router weight).

    Returns y as a new float32 tensor [M, H] on x's device. The kernels that
    ran are layer.selection() / layer.report()."""
    if x.dim() != 2:
        raise ValueError(f"x must be [M, hidden], got {tuple(x.shape)}")
    m = x.shape[0]
    on_gpu = x.device.type == "cuda"
    if on_gpu == layer.device.info["host_memory"]:
        raise ValueError(f"x is on {x.device}, the layer's device is "
                         f"{layer.device.info['spec']}")
    stream = None
    if on_gpu:
        s = torch.cuda.current_stream(x.device).cuda_stream
        stream = s or None  # 0: the default stream, which the library uses
    x = _aligned(x, torch.bfloat16)
    y = torch.empty((m, x.shape[1]), dtype=torch.float32, device=x.device)
    if router_logits_or_topk is None:
        layer.run(x, m, y, stream)
    elif isinstance(router_logits_or_topk, (tuple, list)):
        ids, weights = router_logits_or_topk
        ids, weights = _aligned(ids, torch.int32), _aligned(weights, torch.float32)
        layer.run_topk(x, ids, weights, m, y, stream)
    else:
        logits = _aligned(router_logits_or_topk, torch.bfloat16)
        layer.run_logits(x, logits, m, y, stream)
    return y
