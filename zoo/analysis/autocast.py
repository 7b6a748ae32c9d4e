"""Autocast on meta: torch.autocast's CUDA casts, emulated above autograd, so a meta step under amp-* saves what a
real autocast step saves (fp16 inputs of matmuls and convolutions, fp32 softmax and layer-norm outputs, fp32
residual streams where an fp16 output meets an fp32 tensor).

torch.autocast has no meta backend: its casts happen at the Autocast dispatch key of the tensors' device. This mode
makes them at the torch-function level instead, so autograd records each cast (and saves the cast copy, as the real
one does). The op lists are autocast's CUDA lists (aten/src/ATen/autocast_mode.cpp, PyTorch 1.12 to 2.x), as the
functions a module calls reach them: the lower-precision list casts every floating tensor argument to the compute
dtype, the fp32 list casts lower-precision ones to float32, everything else runs in the dtypes it is given (type
promotion: fp16 + fp32 is fp32). Casts of a parameter are cached for the whole step, as autocast's weight cache is
while backward runs inside the autocast region (timm's benchmark.py) and as autograd keeps the copies it saved.
A composite a module calls directly (nn.MultiheadAttention's functional form) is cast as one op, not op by op.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

T = torch.Tensor
LOWER = {  # autocast's lower-precision ("fp16") list
    F.linear,
    F.bilinear,
    F.conv1d,
    F.conv2d,
    F.conv3d,
    F.conv_transpose1d,
    F.conv_transpose2d,
    F.conv_transpose3d,
    F.prelu,
    F.scaled_dot_product_attention,
    torch.matmul,
    T.matmul,
    T.__matmul__,
    T.__rmatmul__,
    torch.mm,
    T.mm,
    torch.bmm,
    T.bmm,
    torch.baddbmm,
    T.baddbmm,
    torch.addmm,
    T.addmm,
    torch.addbmm,
    torch.mv,
    torch.addmv,
    torch.einsum,
    torch.chain_matmul,
}
FP32 = {  # autocast's float32 list (the ones a vision or language model calls)
    F.layer_norm,
    F.group_norm,
    F.softmax,
    F.log_softmax,
    F.cross_entropy,
    F.nll_loss,
    F.mse_loss,
    F.l1_loss,
    F.smooth_l1_loss,
    F.binary_cross_entropy_with_logits,
    F.softplus,
    F.cosine_similarity,
    torch.softmax,
    T.softmax,
    torch.log_softmax,
    T.log_softmax,
    torch.exp,
    T.exp,
    torch.log,
    T.log,
    torch.pow,
    T.pow,
    T.__pow__,
    torch.rsqrt,
    T.rsqrt,
    torch.reciprocal,
    T.reciprocal,
    torch.sum,
    T.sum,
    torch.cumsum,
    T.cumsum,
    torch.norm,
    T.norm,
    torch.cdist,
    torch.logsumexp,
    T.logsumexp,
}


class MetaAutocast(TorchFunctionMode):
    """Cast as torch.autocast(device_type="cuda", dtype=dtype) would, on any device (meant for meta)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        self.weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(param) -> (param, its cast)

    def cast(self, value, to: torch.dtype, frm: tuple):
        if isinstance(value, (list, tuple)):
            return type(value)(self.cast(v, to, frm) for v in value)
        if not isinstance(value, torch.Tensor) or value.dtype not in frm or value.dtype == to:
            return value
        if value.is_leaf and value.requires_grad:
            hit = self.weights.get(id(value))
            if hit is None or hit[0] is not value:
                hit = self.weights[id(value)] = (value, value.to(to))
            return hit[1]
        return value.to(to)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in LOWER:
            to, frm = self.dtype, (torch.float32, torch.float64)
        elif func in FP32:
            to, frm = torch.float32, (torch.float16, torch.bfloat16)
            if func in (torch.sum, T.sum, torch.cumsum, T.cumsum) and "dtype" in kwargs:
                return func(*args, **kwargs)
        else:
            return func(*args, **kwargs)
        args = tuple(self.cast(a, to, frm) for a in args)
        kwargs = {k: self.cast(v, to, frm) for k, v in kwargs.items()}
        return func(*args, **kwargs)
