"""torch.compile(backend="tpu"): AOTAutograd turns the captured graph into
aten forward and backward graphs; each runs under defer-and-fuse, so its
ops are recorded as one runtime graph, compiled once through the compile
cache and launched as one program per flush (later calls hit the cache).
Graph breaks fall back to eager, as with any dynamo backend; a graph with
dynamic dimensions runs padded to shape buckets (buckets.py), so the
sizes of a bucket share its programs.
"""

from __future__ import annotations

import functools
import json
from typing import Optional

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import register_backend

from . import _C, buckets

_DEFER_AND_FUSE = 2


# --- compiler options (torch.tpu.compiler) --------------------------------------


def compiler_options() -> dict:
    """The compiler options set now (see `custom_compiler_options`)."""
    return json.loads(_C.compiler_options())


class custom_compiler_options:
    """Compile every program from now on with these options added to those
    already set: on xla, XLA debug options by name, e.g.
    ``{"xla_allow_excess_precision": True}`` or
    ``{"xla_cpu_enable_fast_math": True}`` (a name XLA does not know makes
    the next compile fail naming it); the host ignores them. Also a context
    manager that restores the previous options on exit. What the devices'
    current streams hold recorded under defer-and-fuse is launched first,
    on entry and on exit, so it compiles with the options it was recorded
    under. The options are part of every compile-cache key."""

    def __init__(self, options: dict):
        if not isinstance(options, dict):
            raise TypeError(f"compiler options must be a dict of names to values, not {type(options).__name__}")
        self.prev = compiler_options()
        merged = dict(self.prev)
        merged.update(options)
        _set(merged)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _set(self.prev)
        return False


def _set(options: dict) -> None:
    try:
        text = json.dumps(options, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"compiler options {options!r}: {e}") from None
    if _C.is_initialized():
        for d in range(_C.device_count()):
            _C.launch_deferred(d)
    _C.set_compiler_options(text)


def _in_defer_mode(run):
    @functools.wraps(run)
    def call(*args):
        _C.push_eager_mode(_DEFER_AND_FUSE)
        try:
            return run(*args)
        finally:
            _C.pop_eager_mode()

    return call


def _deferred(gm: torch.fx.GraphModule, example_inputs):
    # A graph with dynamic dimensions runs padded to shape buckets where
    # buckets.py has a rule for each of its ops; else as traced.
    return make_boxed_func(buckets.wrap(gm, _in_defer_mode))


def _deferred_forward(gm: torch.fx.GraphModule, example_inputs):
    # The forward's outputs from `num_forward` on are saved for the
    # backward (AOTAutograd's layout); padded, they stay padded.
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    saved_from = getattr(meta, "num_forward", None)
    return make_boxed_func(buckets.wrap(gm, _in_defer_mode, saved_from))


def _make_backend():
    return aot_autograd(fw_compiler=_deferred_forward, bw_compiler=_deferred, inference_compiler=_deferred)


# --- attention in compiled graphs ----------------------------------------------------
#
# torch's meta function for the fused attention op lays its output out like
# the query, and the traced query's strides follow torch's stride
# propagation through elementwise ops (rotary on a transposed view keeps
# the permuted layout), which the tpu kernels (contiguous results) do not
# reproduce: a later view in the traced graph would not fit the real
# strides. So the backend rewrites each plain attention call of the dynamo
# graph (no mask, no dropout, f32) into `tpurt::attention`, whose result is
# contiguous both when traced and when run, over the runtime's attention
# op and its backward. Other calls are traced to torch's math decomposition.


@torch.library.custom_op("tpurt::attention", mutates_args=())
def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: Optional[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = _C.call_op("scaled_dot_product_attention", [q, k, v], _attention_attrs(q, k, is_causal, scale))
    return out, lse


@_attention.register_fake
def _attention_fake(q, k, v, is_causal, scale):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    return out, lse


@torch.library.custom_op("tpurt::attention_backward", mutates_args=())
def _attention_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool,
    scale: Optional[float],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gq, gk, gv = _C.call_op(
        "scaled_dot_product_attention_backward",
        [grad.contiguous(), q, k, v, out, lse],
        _attention_attrs(q, k, is_causal, scale),
    )
    return gq, gk, gv


@_attention_backward.register_fake
def _attention_backward_fake(grad, q, k, v, out, lse, is_causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_attrs(q, k, is_causal, scale) -> dict:
    attrs = {"is_causal": bool(is_causal), "dropout_p": 0.0}
    if scale is not None:
        attrs["scale"] = float(scale)
    if q.shape[-3] > k.shape[-3]:
        attrs["enable_gqa"] = True
    return attrs


def _attention_setup(ctx, inputs, output):
    q, k, v, is_causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.is_causal, ctx.scale = is_causal, scale


def _attention_grad(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    gq, gk, gv = _attention_backward(grad_out, q, k, v, out, lse, ctx.is_causal, ctx.scale)
    return gq, gk, gv, None, None


_attention.register_autograd(_attention_grad, setup_context=_attention_setup)


def _fused_attention(q, k, v, is_causal, scale):
    # Contiguous operands: the runtime's op then gives contiguous results,
    # as the fake implementation says.
    return _attention(q.contiguous(), k.contiguous(), v.contiguous(), is_causal, scale)[0]


def _plain_attention(node: torch.fx.Node) -> Optional[tuple]:
    """(q, k, v, is_causal, scale) when `node` is a plain f32 attention call
    (no mask, no dropout) with key/value heads equal to the query's or, with
    enable_gqa, dividing them; else None."""
    if node.op != "call_function" or node.target is not torch._C._nn.scaled_dot_product_attention:
        return None
    names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    given = dict(zip(names, node.args))
    given.update(node.kwargs)
    if any(n not in names for n in given) or not all(n in given for n in names[:3]):
        return None
    q, k, v = given["query"], given["key"], given["value"]
    mask, p = given.get("attn_mask"), given.get("dropout_p", 0.0)
    causal, scale, gqa = given.get("is_causal", False), given.get("scale"), given.get("enable_gqa", False)
    if mask is not None or p != 0.0 or not isinstance(causal, bool) or not isinstance(gqa, bool):
        return None
    if scale is not None and not isinstance(scale, (int, float)):
        return None
    vals = [x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None for x in (q, k, v)]
    if any(not isinstance(t, torch.Tensor) for t in vals):
        return None
    tq, tk, tv = vals
    if any(t.dtype != torch.float32 or t.dim() < 3 for t in vals) or tk.dim() != tq.dim() or tv.dim() != tq.dim():
        return None
    hq, hk = tq.shape[-3], tk.shape[-3]
    if tq.shape[:-3] != tk.shape[:-3] or tk.shape[:-2] != tv.shape[:-2] or hk == 0:
        return None
    if not (hq == hk or (gqa and hq % hk == 0)):
        return None
    if not causal and isinstance(tk.shape[-2], torch.SymInt):
        # Keys of a dynamic length are padded to a shape bucket, and the
        # runtime's op has no mask to keep the padding out; torch's math
        # decomposition gets one from buckets.py.
        return None
    return q, k, v, causal, scale


def _rewrite_attention(gm: torch.fx.GraphModule) -> int:
    """Rewrite gm's plain attention calls to the runtime's op; returns how many."""
    done = 0
    for node in list(gm.graph.nodes):
        plain = _plain_attention(node)
        if plain is None:
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(_fused_attention, plain)
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done += 1
    if done:
        gm.recompile()
    return done


_tpu_aot = None


@register_backend(name="tpu")
def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The dynamo backend named "tpu". torch.compile's `mode` and
    `options` (inductor's knobs) do not apply and are ignored."""
    global _tpu_aot
    if _tpu_aot is None:
        _tpu_aot = _make_backend()
    # AOTAutograd traces here. Plain attention calls become the runtime's
    # attention op (see `_rewrite_attention`) where it is enabled; the rest
    # are traced to torch's math decomposition, never to the fused op that
    # torch's own dispatch would pick.
    was = _C.fused_attention_enabled()
    if was:
        _rewrite_attention(gm)
    _C.set_fused_attention_enabled(False)
    try:
        return _tpu_aot(gm, example_inputs)
    finally:
        _C.set_fused_attention_enabled(was)
