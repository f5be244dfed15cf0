"""torch.compile(backend="tpu"): AOTAutograd turns the captured graph into
aten forward and backward graphs; each runs under defer-and-fuse, so its
ops are recorded as one runtime graph, compiled once through the compile
cache and launched as one program per flush (later calls hit the cache).
Graph breaks fall back to eager, as with any dynamo backend; dynamic
dimensions are handled by dynamo (each new shape records a new graph).
"""

from __future__ import annotations

import functools

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import register_backend

from . import _C

_DEFER_AND_FUSE = 2


def _deferred(gm: torch.fx.GraphModule, example_inputs):
    run = gm.forward

    @functools.wraps(run)
    def call(*args):
        _C.push_eager_mode(_DEFER_AND_FUSE)
        try:
            return run(*args)
        finally:
            _C.pop_eager_mode()

    return make_boxed_func(call)


def _make_backend():
    return aot_autograd(fw_compiler=_deferred, bw_compiler=_deferred, inference_compiler=_deferred)


_tpu_aot = None


@register_backend(name="tpu")
def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The dynamo backend named "tpu". torch.compile's `mode` and
    `options` (inductor's knobs) do not apply and are ignored."""
    global _tpu_aot
    if _tpu_aot is None:
        _tpu_aot = _make_backend()
    # AOTAutograd traces here. scaled_dot_product_attention is traced to
    # torch's math decomposition, not to the runtime's attention op: that
    # op's meta function lays its output out like the query, and the query's
    # traced layout follows torch's stride propagation through elementwise
    # ops, which the tpu kernels (contiguous results) do not reproduce, so a
    # later view in the graph would not fit the real strides.
    was = _C.fused_attention_enabled()
    _C.set_fused_attention_enabled(False)
    try:
        return _tpu_aot(gm, example_inputs)
    finally:
        _C.set_fused_attention_enabled(was)
