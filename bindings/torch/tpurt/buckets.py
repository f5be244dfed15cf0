"""Shape buckets for torch.compile(backend="tpu").

A graph that dynamo traced with dynamic dimensions (symbols such as s0
for a sequence length) would record a new runtime program for every new
size. Here each symbol's size n is rounded up to its bucket B (the
compile cache's policy, `torch.tpu.set_shape_buckets`): the inputs are
padded with zeros to B, the graph runs at B, and every result is cut back
to n. All sizes in a bucket then record the same programs.

Results stay exact because the padded lanes are kept out of every value
that is kept: each op that combines elements across a padded axis
(reductions, softmax, contractions, norms' weight gradients, embedding
gradients, losses, attention) gets its padded lanes replaced first, by
the identity of its reduction or by a value that drops out (an ignored
target, a zero gradient), through a mask that is an input of the graph;
a graph value that depends on n itself (a mean's divisor, a Scalar
argument) becomes an input too, so nothing in the recorded programs
depends on n. Elementwise ops, views that keep a padded axis whole or
merge it with the axes inside it, slices from a fixed start, causal
attention and the ops below compute garbage only in padded lanes.

A graph with an op this module has no rule for touching a padded axis,
random numbers over a padded axis (they would differ from the unpadded
draw), or a size used as a value it cannot pass as data runs exactly, at
its own size, as before (`stats()` counts both and names the reasons).

Each axis is described by its components: the sizes, outermost first,
that were merged into it ((s0, s1) for a view of [s0, s1, d] as
[s0*s1, d]); a component with a symbol is padded, its valid lanes are
those below its size at n, and a lane of the axis is valid when every
component's digit is.
"""

from __future__ import annotations

import collections
import math
import operator
import threading
import weakref
from typing import Any, Callable, Optional

import sympy
import torch
import torch.fx

from . import _C

aten = torch.ops.aten

Comps = tuple  # per axis: a tuple of sympy expressions, outermost first


class _Unsupported(Exception):
    pass


_stats_lock = threading.Lock()
_stats = {"bucketed": 0, "exact": 0, "reasons": collections.Counter()}


def stats() -> dict:
    """How many dynamic graphs run padded to buckets and how many exactly,
    with the reasons the exact ones could not be padded."""
    with _stats_lock:
        return {"bucketed": _stats["bucketed"], "exact": _stats["exact"], "reasons": dict(_stats["reasons"])}


def reset_stats() -> None:
    with _stats_lock:
        _stats["bucketed"] = 0
        _stats["exact"] = 0
        _stats["reasons"].clear()


def _count(reason: Optional[str]) -> None:
    with _stats_lock:
        if reason is None:
            _stats["bucketed"] += 1
        else:
            _stats["exact"] += 1
            _stats["reasons"][reason] += 1


# --- symbolic sizes ------------------------------------------------------------------


def _expr(v) -> sympy.Expr:
    if isinstance(v, (torch.SymInt, torch.SymFloat)):
        return sympy.sympify(v.node.expr)
    if isinstance(v, int):
        return sympy.Integer(v)
    raise _Unsupported(f"size {v!r}")


def _static(e) -> bool:
    return not e.free_symbols


def _padded_axis(c: Comps) -> bool:
    return any(not _static(e) for e in c)


def _value_at(e, env):
    v = sympy.sympify(e).subs(env)
    return int(v) if v.is_number else None


def _same(a, b) -> bool:
    """Whether two size expressions are equal for every size. Sympy leaves
    torch's FloorDiv and friends unsimplified ((s**2)//s), so where algebra
    does not show it the two are compared at a few sizes."""
    d = sympy.expand(sympy.sympify(a) - sympy.sympify(b))
    if d == 0:
        return True
    syms = sympy.sympify(a).free_symbols | sympy.sympify(b).free_symbols
    if not syms:
        return False
    for base in (7, 13, 101, 1000):
        env = {x: base + 3 * i for i, x in enumerate(sorted(syms, key=_sym_key))}
        va, vb = _value_at(a, env), _value_at(b, env)
        if va is None or va != vb:
            return False
    return True


def _prod(c: Comps):
    p = sympy.Integer(1)
    for e in c:
        p = p * e
    return p


def _sym_key(s):
    name = str(s)
    digits = "".join(ch for ch in name if ch.isdigit())
    return (name.rstrip("0123456789"), int(digits) if digits else 0)


def _comps_of_size(e) -> Comps:
    """Components of an axis known only by its size: static, or one symbol
    (or an affine expression of one, as a slice leaves). A product of
    symbols is a merge whose order the size does not tell."""
    if _static(e):
        return (e,)
    if len(e.free_symbols) == 1:
        (x,) = e.free_symbols
        try:
            if sympy.degree(sympy.expand(e), x) == 1:
                return (e,)
        except sympy.PolynomialError:
            pass
        # An expression sympy does not simplify ((s**2)//s): affine if it
        # takes the values of a*s + c at a few sizes.
        v10, v20 = _value_at(e, {x: 10}), _value_at(e, {x: 20})
        if v10 is not None and v20 is not None and (v20 - v10) % 10 == 0 and v20 > v10:
            a = (v20 - v10) // 10
            affine = a * x + (v10 - 10 * a)
            if _same(affine, e):
                return (affine,)
    raise _Unsupported(f"axis of size {e} (a merge of padded axes in an unknown order)")


# The layouts of the tensors that forwards saved for their backwards, by
# name and size: AOTAutograd names a backward's input after the forward's
# output, and a merged axis's order (which of s0*s1 is outermost) is known
# only where the merge was made.
_saved_lock = threading.Lock()
_saved: dict = {}


def _saved_key(name, shape):
    return (str(name), tuple(str(sympy.expand(e)) for e in shape))


def _remember_saved(name, shape, comps) -> None:
    if not any(len(c) > 1 and _padded_axis(c) for c in comps):
        return
    with _saved_lock:
        _saved.setdefault(_saved_key(name, shape), set()).add(tuple(tuple(c) for c in comps))
        if len(_saved) > 4096:
            _saved.pop(next(iter(_saved)))


def _saved_layout(name, shape) -> Optional[list]:
    if shape is None:
        return None
    with _saved_lock:
        found = _saved.get(_saved_key(name, shape))
    if found is None or len(found) != 1:
        return None
    return [tuple(c) for c in next(iter(found))]


def _symbolic(v) -> bool:
    if isinstance(v, torch.SymInt):
        return True
    return isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape)


def _shape(node) -> Optional[list]:
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if isinstance(v, torch.Tensor):
        return [_expr(s) for s in v.shape]
    return None


# --- the analysis and rewrite ---------------------------------------------------------


class _Plan:
    """What the padded graph needs at a call: placeholders' kinds, the
    extra inputs (masks, values) and how to cut each output."""

    def __init__(self):
        self.inputs: list = []  # per original placeholder: ("sym", expr) | ("tensor", [Comps]) | ("other",)
        self.extras: list = []  # ("mask", rank, axis, Comps) | ("value", expr, floating)
        self.outputs: list = []  # ("tensor", [Comps]) | ("sym", expr) | ("other",)
        self.output_names: list = []  # (node name, shape, [Comps]) of tensor outputs
        self.symbols: list = []
        self.gm: Optional[torch.fx.GraphModule] = None


_SAME_SHAPE = {
    aten.clone.default,
    aten.detach.default,
    aten.alias.default,
    aten._to_copy.default,
    aten.lift_fresh_copy.default,
    aten.tril.default,
    aten.triu.default,
    aten.cumsum.default,
}

_VIEWS = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.view_copy.default,
}

_FACTORIES = {
    aten.full.default,
    aten.zeros.default,
    aten.ones.default,
    aten.empty.memory_format,
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_empty.default,
    aten.new_full.default,
    aten.arange.default,
    aten.arange.start,
    aten.scalar_tensor.default,
}

_SCALAR_TO_TENSOR = {
    aten.div.Scalar: aten.div.Tensor,
    aten.mul.Scalar: aten.mul.Tensor,
    aten.add.Scalar: aten.add.Tensor,
    aten.sub.Scalar: aten.sub.Tensor,
    aten.div.Tensor: aten.div.Tensor,
    aten.mul.Tensor: aten.mul.Tensor,
    aten.add.Tensor: aten.add.Tensor,
    aten.sub.Tensor: aten.sub.Tensor,
}

_REDUCTIONS = {
    # op: (fill for padded lanes, takes a dim list)
    aten.sum.dim_IntList: 0.0,
    aten.sum.default: 0.0,
    aten.amax.default: -math.inf,
    aten.amin.default: math.inf,
    aten.argmax.default: -math.inf,
    aten.argmin.default: math.inf,
    aten.any.dim: False,
    aten.any.dims: False,
    aten.any.default: False,
    aten.all.dim: True,
    aten.all.default: True,
    aten.prod.dim_int: 1.0,
    aten.logsumexp.default: -math.inf,
}


class _Builder:
    def __init__(self, gm: torch.fx.GraphModule):
        self.old = gm
        self.graph = torch.fx.Graph()
        self.env: dict = {}
        self.comps: dict = {}  # old node -> [Comps] or list of [Comps] (tuples)
        self.sym_nodes: set = set()
        self.plan = _Plan()
        self.extra_nodes: dict = {}
        self.last_placeholder = None
        self.pending = None

    # --- helpers

    def comps_of(self, a):
        if isinstance(a, torch.fx.Node) and a in self.comps:
            return self.comps[a]
        return None

    def check(self, node, comps):
        shape = _shape(node)
        if shape is None or len(shape) != len(comps):
            raise _Unsupported(f"{node.target}: no shape to check")
        for c, s in zip(comps, shape):
            if not _same(_prod(c), s):
                raise _Unsupported(f"{node.target}: axis {c} against size {s}")
        return comps

    def default(self, node):
        return [_comps_of_size(s) for s in _shape(node)]

    def extra(self, spec):
        if spec not in self.extra_nodes:
            if self.last_placeholder is None:
                raise _Unsupported("graph without inputs")
            with self.graph.inserting_after(self.last_placeholder):
                p = self.graph.placeholder(f"_bucket_extra_{len(self.plan.extras)}")
            self.last_placeholder = p
            self.plan.extras.append(spec)
            self.extra_nodes[spec] = p
        return self.extra_nodes[spec]

    def masked(self, new_arg, comps, axes, fill):
        """new_arg with the padded lanes of `axes` set to `fill`."""
        out = new_arg
        rank = len(comps)
        for ax in sorted({a % rank for a in axes}) if rank else []:
            if _padded_axis(comps[ax]):
                m = self.extra(("mask", rank, ax, tuple(comps[ax])))
                # Before the node just emitted, whose argument this becomes.
                if self.pending is not None:
                    with self.graph.inserting_before(self.pending):
                        out = self.graph.call_function(aten.masked_fill.Scalar, (out, m, fill))
                else:
                    out = self.graph.call_function(aten.masked_fill.Scalar, (out, m, fill))
        return out

    def value(self, expr, floating: bool = False):
        return self.extra(("value", sympy.sympify(expr), floating))

    def sym_args(self, args) -> list:
        found = []

        def visit(a):
            if isinstance(a, torch.fx.Node) and a in self.sym_nodes:
                found.append(a)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)

        for a in args:
            visit(a)
        return found

    def tensor_args(self, node):
        """The tensor nodes among node's arguments (lists included)."""
        out = []

        def visit(a):
            if isinstance(a, torch.fx.Node):
                if isinstance(self.comps.get(a), list):
                    out.append(a)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)

        for a in list(node.args) + list(node.kwargs.values()):
            visit(a)
        return out

    def any_padded(self, nodes) -> bool:
        return any(_padded_axis(c) for n in nodes for c in self.comps[n])

    def emit(self, node, args=None, kwargs=None, target=None):
        a = torch.fx.node.map_arg(node.args if args is None else args, lambda n: self.env[n])
        k = torch.fx.node.map_arg(node.kwargs if kwargs is None else kwargs, lambda n: self.env[n])
        new = self.graph.call_function(target or node.target, a, k)
        new.meta.update(node.meta)
        self.pending = new
        return new

    # --- the pass

    def run(self) -> _Plan:
        g = self.old.graph
        for node in g.nodes:
            if node.op == "placeholder":
                self.placeholder(node)
            elif node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                self.output(node)
            elif node.op == "get_attr":
                new = self.graph.get_attr(node.target)
                new.meta.update(node.meta)
                self.env[node] = new
                if isinstance(node.meta.get("val"), torch.Tensor):
                    self.comps[node] = self.default(node)
            else:
                raise _Unsupported(f"node kind {node.op}")
        syms = set()
        for kind in self.plan.inputs:
            if kind[0] == "sym":
                syms |= kind[1].free_symbols
            elif kind[0] == "tensor":
                syms |= {e for c in kind[1] for x in c for e in x.free_symbols}
        solvable = set()
        for kind in self.plan.inputs:
            if kind[0] == "sym" and isinstance(kind[1], sympy.Symbol):
                solvable.add(kind[1])
            elif kind[0] == "tensor":
                solvable |= {c[0] for c in kind[1] if len(c) == 1 and isinstance(c[0], sympy.Symbol)}
        if not syms:
            raise _Unsupported("no dynamic dimension")
        if syms - solvable:
            raise _Unsupported(f"symbols {sorted(map(str, syms - solvable))} not given as sizes")
        self.plan.symbols = sorted(syms, key=_sym_key)
        self.graph.lint()
        self.plan.gm = torch.fx.GraphModule(self.old, self.graph)
        return self.plan

    def placeholder(self, node):
        new = self.graph.placeholder(node.target)
        new.meta.update(node.meta)
        self.env[node] = new
        self.last_placeholder = new
        v = node.meta.get("val")
        if isinstance(v, torch.SymInt):
            self.sym_nodes.add(node)
            self.plan.inputs.append(("sym", _expr(v)))
        elif isinstance(v, torch.Tensor):
            comps = _saved_layout(node.target, _shape(node)) or self.default(node)
            self.comps[node] = comps
            self.plan.inputs.append(("tensor", comps))
        elif isinstance(v, (int, float, bool)) or v is None:
            self.plan.inputs.append(("other",))
        else:
            raise _Unsupported(f"input {node.target} of type {type(v).__name__}")

    def output(self, node):
        (outs,) = node.args
        new_outs = []
        for o in outs if isinstance(outs, (list, tuple)) else [outs]:
            if isinstance(o, torch.fx.Node) and o in self.sym_nodes:
                self.plan.outputs.append(("sym", _expr(o.meta["val"])))
            elif isinstance(o, torch.fx.Node) and o in self.comps and not _is_tuple(self.comps[o]):
                self.plan.outputs.append(("tensor", self.comps[o]))
                self.plan.output_names.append((o.name, _shape(o), self.comps[o]))
            elif o is None or not isinstance(o, torch.fx.Node):
                self.plan.outputs.append(("other",))
            else:
                raise _Unsupported(f"output {o}")
            new_outs.append(self.env[o] if isinstance(o, torch.fx.Node) else o)
        self.graph.output(type(outs)(new_outs) if isinstance(outs, (list, tuple)) else new_outs[0])

    def call(self, node):
        self.pending = None
        t = node.target
        v = node.meta.get("val")
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) or (
            not isinstance(t, torch._ops.OpOverload) and t is not operator.getitem and isinstance(v, (int, float, bool))
        ):
            # Size arithmetic (s0 * s1, sym_size): runs at the padded sizes,
            # which is right where it is used as a size; the rules below
            # refuse it anywhere else.
            self.sym_nodes.add(node)
            self.env[node] = self.emit(node)
            return
        if t is operator.getitem:
            src, i = node.args
            c = self.comps.get(src)
            if not _is_tuple(c):
                raise _Unsupported("getitem of a non-tuple")
            item = c[i]
            self.env[node] = self.emit(node)
            if item is not None:
                self.comps[node] = self.check(node, item)
            return
        if not isinstance(t, torch._ops.OpOverload):
            raise _Unsupported(f"call of {t}")
        rule = _RULES.get(t)
        if rule is None:
            if t in _SCALAR_TO_TENSOR and _has_sym(self, node):
                rule = _scalar_op
            elif t in _VIEWS:
                rule = _view
            elif t in _FACTORIES:
                rule = _factory
            elif t in _REDUCTIONS:
                rule = _reduction
            elif (torch.Tag.pointwise in t.tags or t in _SAME_SHAPE) and torch.Tag.nondeterministic_seeded not in t.tags:
                rule = _pointwise
            else:
                rule = _unknown
        comps = rule(self, node)
        if _is_tuple(comps):
            self.comps[node] = comps
        elif comps is not None:
            self.comps[node] = self.check(node, comps)


def _has_sym(b: "_Builder", node) -> bool:
    return bool(b.sym_args(list(node.args) + list(node.kwargs.values())))


def _is_tuple(c) -> bool:
    return isinstance(c, tuple) and c[:1] != () and (c[0] is None or isinstance(c[0], list))


def _tuple(*items):
    return tuple(items)


# --- rules: each emits the node (with masks) and returns its output's comps --------------


def _no_syms(b: _Builder, node, allowed=()):
    for a in b.sym_args(list(node.args) + list(node.kwargs.values())):
        if a not in allowed:
            raise _Unsupported(f"{node.target}: a size used as a value")


def _unknown(b: _Builder, node):
    ins = b.tensor_args(node)
    if b.any_padded(ins):
        raise _Unsupported(f"{node.target} on a padded axis")
    _no_syms(b, node)
    b.env[node] = b.emit(node)
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor):
        return b.default(node)
    if isinstance(v, (list, tuple)) and all(isinstance(x, torch.Tensor) or x is None for x in v):
        return _tuple(*[None if x is None else [(_expr(s),) for s in x.shape] for x in v])
    return None


def _pointwise(b: _Builder, node):
    _no_syms(b, node)
    shape = _shape(node)
    if shape is None:
        return _unknown(b, node)
    out = _broadcast(b, node, b.tensor_args(node), shape)
    b.env[node] = b.emit(node)
    return out


def _broadcast(b: _Builder, node, operands, shape) -> list:
    """The comps of `shape`, broadcast from the operands' (right-aligned)."""
    out = []
    r = len(shape)
    for i in range(r):
        choice = None
        for a in operands:
            c = b.comps[a]
            j = i - (r - len(c))
            if j < 0:
                continue
            if _same(_prod(c[j]), shape[i]):
                if choice is None or not _padded_axis(choice):
                    choice = c[j]
                elif _padded_axis(c[j]) and tuple(c[j]) != tuple(choice):
                    raise _Unsupported(f"{node.target}: operands disagree on axis {i}")
        out.append(choice if choice is not None else _comps_of_size(shape[i]))
    return out


def _index(b: _Builder, node):
    # x[i0, i1, ...] with an index tensor for every axis: the indices'
    # padded lanes point at 0, so every lane reads within x; the valid
    # lanes read what they would unpadded.
    x, indices = node.args[0], node.args[1]
    if any(i is None for i in indices) or len(indices) != len(b.comps[x]):
        if b.any_padded(b.tensor_args(node)):
            raise _Unsupported("index with a None axis on a padded axis")
        return _unknown(b, node)
    _no_syms(b, node)
    idx = [i for i in indices]
    masked = [b.masked(b.env[i], b.comps[i], list(range(len(b.comps[i]))), 0) for i in idx]
    new = b.graph.call_function(node.target, (b.env[x], masked), dict(node.kwargs))
    new.meta.update(node.meta)
    b.env[node] = new
    return _broadcast(b, node, idx, _shape(node))


def _scalar_op(b: _Builder, node):
    # add/sub/mul/div by a size: the size at n, as a 0-d input.
    syms = b.sym_args(node.args)
    if not syms:
        return _pointwise(b, node)
    x, s = node.args[0], node.args[1]
    if s not in b.sym_nodes or syms != [s] or node.kwargs.get("alpha", 1) != 1:
        raise _Unsupported(f"{node.target}: a size used as a value")
    val = b.value(_expr(s.meta["val"]), isinstance(s.meta["val"], torch.SymFloat))
    new = b.graph.call_function(_SCALAR_TO_TENSOR[node.target], (b.env[x], val))
    new.meta.update(node.meta)
    b.env[node] = new
    return list(b.comps[x])


def _regroup(src: list, sizes: list) -> list:
    """The input's components regrouped to the output sizes; a padded
    component may not be split."""
    queue = [e for c in src for e in c if not (_static(e) and e == 1)]
    out = []
    for size in sizes:
        if _static(size) and size == 1:
            out.append((sympy.Integer(1),))
            continue
        got = []
        while True:
            have = _prod(got)
            if got and _same(have, size):
                break
            if not queue:
                raise _Unsupported(f"view to {sizes}")
            nxt = queue.pop(0)
            if _static(nxt) and _static(size) and _static(have):
                rest = size / have
                if nxt.is_integer and rest.is_integer and nxt > rest and nxt % rest == 0:
                    got.append(rest)
                    queue.insert(0, nxt / rest)
                    continue
            got.append(nxt)
        statics = [e for e in got if _static(e)]
        if len(statics) > 1:
            # merge neighbouring static components
            merged, run = [], sympy.Integer(1)
            for e in got:
                if _static(e):
                    run = run * e
                else:
                    if run != 1:
                        merged.append(run)
                    run = sympy.Integer(1)
                    merged.append(e)
            if run != 1:
                merged.append(run)
            got = merged
        out.append(tuple(got))
    if queue:
        raise _Unsupported(f"view to {sizes}")
    return out


def _view(b: _Builder, node):
    x = node.args[0]
    if x not in b.comps:
        raise _Unsupported(f"{node.target} of a non-tensor")
    _no_syms(b, node, allowed=b.sym_args(node.args[1:]))
    b.env[node] = b.emit(node)
    return _regroup(b.comps[x], _shape(node))


def _permute(b: _Builder, node):
    x = node.args[0]
    c = b.comps[x]
    r = len(c)
    t = node.target
    if t is aten.t.default:
        order = list(range(r))[::-1]
    elif t is aten.transpose.int:
        d0, d1 = node.args[1] % r, node.args[2] % r
        order = list(range(r))
        order[d0], order[d1] = order[d1], order[d0]
    else:
        order = [d % r for d in node.args[1]]
    b.env[node] = b.emit(node)
    return [c[d] for d in order]


def _expand(b: _Builder, node):
    x, sizes = node.args[0], node.args[1]
    c = b.comps[x]
    shape = _shape(node)
    out = []
    for i, s in enumerate(shape):
        j = i - (len(shape) - len(c))
        if j >= 0 and _same(_prod(c[j]), s):
            out.append(c[j])
        else:
            out.append(_comps_of_size(s))
    b.env[node] = b.emit(node)
    return out


def _slice(b: _Builder, node):
    t = node.target
    x = node.args[0]
    c = list(b.comps[x])
    r = len(c)
    if t is aten.slice.Tensor:
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        start = node.args[2] if len(node.args) > 2 else node.kwargs.get("start", None)
        step = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
        extra_syms = b.sym_args(node.args[3:4])
    else:  # narrow
        dim, start = node.args[1], node.args[2]
        step = 1
        extra_syms = b.sym_args(node.args[3:4])
    dim %= r
    if (
        isinstance(start, torch.fx.Node)
        and start in b.sym_nodes
        and step == 1
        and _same(-_expr(start.meta["val"]), _prod(c[dim]))
        and _same(_shape(node)[dim], _prod(c[dim]))
    ):
        # x[:, -n:] over an axis of size n: the whole axis, at any size.
        extra_syms = extra_syms + [start]
        start = 0
    _no_syms(b, node, allowed=extra_syms)
    b.env[node] = b.emit(node)
    shape = _shape(node)
    if not _padded_axis(c[dim]):
        c[dim] = (shape[dim],)
        return c
    if len(c[dim]) != 1 or step != 1 or not (start is None or (isinstance(start, int) and start >= 0)):
        raise _Unsupported(f"{t} of a padded axis from the end or by a size")
    c[dim] = _comps_of_size(shape[dim])
    return c


def _select(b: _Builder, node):
    x, dim, index = node.args
    c = list(b.comps[x])
    dim %= len(c)
    _no_syms(b, node)
    if _padded_axis(c[dim]) and not (isinstance(index, int) and index >= 0):
        raise _Unsupported("select of a padded axis from the end or by a size")
    b.env[node] = b.emit(node)
    del c[dim]
    return c


def _split(b: _Builder, node):
    x = node.args[0]
    c = b.comps[x]
    dim = (node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) % len(c)
    if _padded_axis(c[dim]):
        raise _Unsupported("split of a padded axis")
    _no_syms(b, node)
    b.env[node] = b.emit(node)
    items = []
    for v in node.meta["val"]:
        cc = list(c)
        cc[dim] = (_expr(v.shape[dim]),)
        items.append(cc)
    return _tuple(*items)


def _cat(b: _Builder, node):
    xs = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    # torch.cat skips 1-D empty operands (a cache's first update cats onto one).
    cs = [b.comps[x] for x in xs if _shape(x) is not None and not (len(_shape(x)) == 1 and _shape(x)[0] == 0)]
    if not cs:
        return _unknown(b, node)
    dim %= len(cs[0])
    if len(cs) == 1:
        _no_syms(b, node)
        b.env[node] = b.emit(node)
        return list(cs[0])
    if any(_padded_axis(c[dim]) for c in cs):
        raise _Unsupported("cat along a padded axis")
    _no_syms(b, node)
    out = list(cs[0])
    for i in range(len(out)):
        if i != dim:
            padded = [c[i] for c in cs if _padded_axis(c[i])]
            if padded and any(tuple(p) != tuple(padded[0]) for p in padded) or (padded and len(padded) != len(cs)):
                raise _Unsupported("cat of operands padded differently")
            if padded:
                out[i] = padded[0]
    out[dim] = (_shape(node)[dim],)
    b.env[node] = b.emit(node)
    return out


def _constant_pad(b: _Builder, node):
    # Padding at either end of a padded axis: its padded lanes take the
    # pad value first, so the lanes after the valid ones hold it as they
    # would unpadded.
    x, pads = node.args[0], node.args[1]
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0.0)
    c = list(b.comps[x])
    _no_syms(b, node)
    if any(isinstance(p, torch.fx.Node) or p < 0 for p in pads) or isinstance(value, torch.fx.Node):
        raise _Unsupported("constant_pad_nd by a size or cropping")
    axes = [len(c) - 1 - i // 2 for i in range(0, len(pads), 2)]
    padded = [a for a in axes if _padded_axis(c[a])]
    if any(len(c[a]) != 1 for a in padded):
        raise _Unsupported("constant_pad_nd of a merged padded axis")
    x_new = b.masked(b.env[x], c, padded, value)
    new = b.graph.call_function(node.target, (x_new, *node.args[1:]), dict(node.kwargs))
    new.meta.update(node.meta)
    b.env[node] = new
    shape = _shape(node)
    for a in axes:
        c[a] = _comps_of_size(shape[a])
    return c


def _slice_backward(b: _Builder, node):
    # The gradient of a slice from a fixed start: its padded lanes zeroed,
    # so the lanes after the slice's valid ones stay zero as unpadded.
    grad, sizes, dim, start, end, step = node.args
    c = b.comps[grad]
    dim %= len(c)
    _no_syms(b, node, allowed=b.sym_args([sizes, end]))
    if _padded_axis(c[dim]) and (step != 1 or not isinstance(start, int) or start < 0):
        raise _Unsupported("slice_backward of a padded axis from the end or by a size")
    g = b.masked(b.env[grad], c, list(range(len(c))), 0.0)
    new = b.emit(node)
    new.update_arg(0, g)
    b.env[node] = new
    return b.default(node)


def _select_backward(b: _Builder, node):
    # The gradient of a select at a fixed index: grad written at it, zeros
    # elsewhere; grad's padded lanes land in the result's padded lanes.
    grad, sizes, dim, index = node.args
    _no_syms(b, node, allowed=b.sym_args([sizes]))
    shape = _shape(node)
    if _padded_axis(_comps_of_size(shape[dim % len(shape)])) and not (isinstance(index, int) and index >= 0):
        raise _Unsupported("select_backward of a padded axis from the end or by a size")
    b.env[node] = b.emit(node)
    out = list(b.comps[grad])
    out.insert(dim % len(shape), _comps_of_size(shape[dim % len(shape)]))
    return out


def _factory(b: _Builder, node):
    t = node.target
    if t in (aten.full.default, aten.new_full.default):
        fill = node.args[-1] if t is aten.full.default else node.args[2]
        if isinstance(fill, torch.fx.Node):
            raise _Unsupported(f"{t} with a size as its value")
    if t in (aten.arange.start,):
        if isinstance(node.args[0], torch.fx.Node):
            raise _Unsupported("arange from a size")
    if t is aten.scalar_tensor.default:
        _no_syms(b, node)
    b.env[node] = b.emit(node)
    return b.default(node)


def _reduction(b: _Builder, node):
    t = node.target
    x = node.args[0]
    c = b.comps[x]
    r = len(c)
    if t in (aten.sum.default, aten.any.default, aten.all.default):
        dims = list(range(r))
    elif t in (aten.argmax.default, aten.argmin.default):
        d = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = list(range(r)) if d is None else [d]
    elif t in (aten.any.dim, aten.all.dim, aten.prod.dim_int):
        dims = [node.args[1]]
    else:
        d = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = list(range(r)) if d is None or d == [] else ([d] if isinstance(d, int) else list(d))
    dims = [d % r for d in dims] if r else []
    _no_syms(b, node)
    fill = _REDUCTIONS[t]
    args = list(node.args)
    x_new = b.env[x]
    if r and any(_padded_axis(c[d]) for d in dims):
        if fill is False or fill is True:
            pass
        elif x.meta["val"].dtype == torch.bool:
            fill = bool(fill)
        elif not x.meta["val"].dtype.is_floating_point and math.isinf(fill):
            info = torch.iinfo(x.meta["val"].dtype)
            fill = info.min if fill < 0 else info.max
        x_new = b.masked(x_new, c, dims, fill)
    new = b.graph.call_function(t, (x_new, *[torch.fx.node.map_arg(a, lambda n: b.env[n]) for a in args[1:]]),
                                torch.fx.node.map_arg(node.kwargs, lambda n: b.env[n]))
    new.meta.update(node.meta)
    b.env[node] = new
    return _reduced(node, c, dims)


def _reduced(node, c, dims):
    shape = _shape(node)
    keep = len(shape) == len(c)
    out = []
    for i, ci in enumerate(c):
        if i in dims:
            if keep:
                out.append((sympy.Integer(1),))
        else:
            out.append(ci)
    return out


def _mean(b: _Builder, node):
    x = node.args[0]
    c = b.comps[x]
    r = len(c)
    d = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    dims = list(range(r)) if node.target is aten.mean.default or d is None or d == [] else [a % r for a in d]
    keep = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))
    _no_syms(b, node)
    if not any(_padded_axis(c[i]) for i in dims):
        b.env[node] = b.emit(node)
        return _reduced(node, c, dims)
    dtype = node.meta["val"].dtype
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    m = b.masked(b.env[x], c, dims, 0.0)
    s = b.graph.call_function(aten.sum.dim_IntList, (m, dims, keep), {"dtype": acc})
    count = b.value(_prod([e for i in dims for e in c[i]]))
    q = b.graph.call_function(aten.div.Tensor, (s, count))
    if acc != dtype:
        q = b.graph.call_function(aten._to_copy.default, (q,), {"dtype": dtype})
    q.meta.update(node.meta)
    b.env[node] = q
    return _reduced(node, c, dims)


def _softmax(b: _Builder, node):
    x, dim = node.args[0], node.args[1]
    c = b.comps[x]
    _no_syms(b, node)
    new = b.emit(node)
    new.update_arg(0, b.masked(b.env[x], c, [dim], -math.inf))
    b.env[node] = new
    return list(c)


def _softmax_backward(b: _Builder, node):
    grad, out, dim = node.args[0], node.args[1], node.args[2]
    c = b.comps[grad]
    _no_syms(b, node)
    g = b.masked(b.env[grad], c, [dim], 0.0)
    new = b.emit(node)
    new.update_arg(0, g)
    b.env[node] = new
    return list(c)


def _contraction(b: _Builder, node):
    t = node.target
    _no_syms(b, node)
    if t in (aten.mm.default, aten.bmm.default):
        lhs, rhs = node.args[0], node.args[1]
        li, ri = 0, 1
    else:  # addmm, baddbmm: (self, a, b)
        lhs, rhs = node.args[1], node.args[2]
        li, ri = 1, 2
    lc, rc = b.comps[lhs], b.comps[rhs]
    k_l, k_r = len(lc) - 1, len(rc) - 2
    new = b.emit(node)
    if _padded_axis(lc[k_l]) or _padded_axis(rc[k_r]):
        new.update_arg(li, b.masked(b.env[lhs], lc, [k_l], 0.0))
        new.update_arg(ri, b.masked(b.env[rhs], rc, [k_r], 0.0))
    b.env[node] = new
    out = [*lc[:-1], rc[-1]]
    if t in (aten.bmm.default, aten.baddbmm.default) and not _padded_axis(lc[0]) and _padded_axis(rc[0]):
        out[0] = rc[0]
    return out


def _layer_norm(b: _Builder, node):
    x, normalized = node.args[0], node.args[1]
    c = b.comps[x]
    k = len(normalized)
    if any(_padded_axis(ci) for ci in c[len(c) - k:]):
        raise _Unsupported("layer_norm over a padded axis")
    _no_syms(b, node)
    b.env[node] = b.emit(node)
    stat = [*c[: len(c) - k], *[(sympy.Integer(1),)] * k]
    return _tuple(list(c), stat, list(stat))


def _layer_norm_backward(b: _Builder, node):
    grad, x, normalized, mean, rstd = node.args[:5]
    c = b.comps[x]
    k = len(normalized)
    if any(_padded_axis(ci) for ci in c[len(c) - k:]):
        raise _Unsupported("layer_norm over a padded axis")
    _no_syms(b, node)
    lead = list(range(len(c) - k))
    new = b.emit(node)
    if any(_padded_axis(c[i]) for i in lead):
        # Padded rows add nothing to the weight and bias gradients.
        new.update_arg(0, b.masked(b.env[grad], b.comps[grad], lead, 0.0))
        new.update_arg(1, b.masked(b.env[x], c, lead, 0.0))
        new.update_arg(3, b.masked(b.env[mean], b.comps[mean], lead, 0.0))
        new.update_arg(4, b.masked(b.env[rstd], b.comps[rstd], lead, 0.0))
    b.env[node] = new
    w = node.args[5]
    wc = list(b.comps[w]) if isinstance(w, torch.fx.Node) else None
    return _tuple(list(c), wc, None if wc is None else list(wc))


def _embedding(b: _Builder, node):
    w, ids = node.args[0], node.args[1]
    ic = b.comps[ids]
    _no_syms(b, node)
    new = b.emit(node)
    new.update_arg(1, b.masked(b.env[ids], ic, list(range(len(ic))), 0))
    b.env[node] = new
    return [*ic, b.comps[w][-1]]


def _embedding_backward(b: _Builder, node):
    grad, ids = node.args[0], node.args[1]
    ic, gc = b.comps[ids], b.comps[grad]
    _no_syms(b, node)
    new = b.emit(node)
    new.update_arg(0, b.masked(b.env[grad], gc, list(range(len(ic))), 0.0))
    new.update_arg(1, b.masked(b.env[ids], ic, list(range(len(ic))), 0))
    b.env[node] = new
    return b.default(node)


def _nll(b: _Builder, node):
    fwd = node.target is aten.nll_loss_forward.default
    x, target = (node.args[0], node.args[1]) if fwd else (node.args[1], node.args[2])
    ignore = node.args[4] if fwd else node.args[5]
    reduction = node.args[3] if fwd else node.args[4]
    tc = b.comps[target]
    _no_syms(b, node)
    new = b.emit(node)
    new.update_arg(1 if fwd else 2, b.masked(b.env[target], tc, list(range(len(tc))), ignore))
    if not fwd:
        new.update_arg(0, b.masked(b.env[node.args[0]], b.comps[node.args[0]],
                                   list(range(len(b.comps[node.args[0]]))), 0.0) if reduction == 0 else b.env[node.args[0]])
    b.env[node] = new
    if fwd:
        out = list(tc) if reduction == 0 else []
        return _tuple(out, [])
    return list(b.comps[x])


def _attention(b: _Builder, node):
    q, k, v, causal = node.args[0], node.args[1], node.args[2], node.args[3]
    qc, kc, vc = b.comps[q], b.comps[k], b.comps[v]
    _no_syms(b, node)
    if _padded_axis(kc[-2]) and not (causal and tuple(qc[-2]) == tuple(kc[-2])):
        raise _Unsupported("attention over padded keys without a causal mask")
    new = b.emit(node)
    for i, (a, c) in enumerate(((q, qc), (k, kc), (v, vc))):
        new.update_arg(i, b.masked(b.env[a], c, [len(c) - 2], 0.0))
    b.env[node] = new
    return _tuple([*qc[:-1], vc[-1]], list(qc[:-1]))


def _attention_backward(b: _Builder, node):
    grad, q, k, v, out, lse, causal = node.args[:7]
    qc, kc, vc = b.comps[q], b.comps[k], b.comps[v]
    _no_syms(b, node)
    if _padded_axis(kc[-2]) and not (causal and tuple(qc[-2]) == tuple(kc[-2])):
        raise _Unsupported("attention over padded keys without a causal mask")
    new = b.emit(node)
    for i, a in enumerate((grad, q, k, v, out, lse)):
        c = b.comps[a]
        axis = len(c) - 1 if a is lse else len(c) - 2
        new.update_arg(i, b.masked(b.env[a], c, [axis], 0.0))
    b.env[node] = new
    return _tuple(list(qc), list(kc), list(vc))


def _gather_like(b: _Builder, node):
    t = node.target
    _no_syms(b, node)
    x, dim, idx = node.args[0], node.args[1], node.args[2]
    ic = b.comps[idx]
    new = b.emit(node)
    new.update_arg(2, b.masked(b.env[idx], ic, list(range(len(ic))), 0))
    b.env[node] = new
    c = list(b.comps[x])
    if t is aten.index_select.default:
        c[dim % len(c)] = ic[0]
        return c
    return list(ic)


_RULES: dict = {
    aten.t.default: _permute,
    aten.transpose.int: _permute,
    aten.permute.default: _permute,
    aten.expand.default: _expand,
    aten.slice.Tensor: _slice,
    aten.narrow.default: _slice,
    aten.select.int: _select,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    aten.cat.default: _cat,
    aten.slice_backward.default: _slice_backward,
    aten.select_backward.default: _select_backward,
    aten.constant_pad_nd.default: _constant_pad,
    aten.mean.dim: _mean,
    aten.mean.default: _mean,
    aten._softmax.default: _softmax,
    aten._log_softmax.default: _softmax,
    aten._safe_softmax.default: _softmax,
    aten._softmax_backward_data.default: _softmax_backward,
    aten._log_softmax_backward_data.default: _softmax_backward,
    aten.mm.default: _contraction,
    aten.bmm.default: _contraction,
    aten.addmm.default: _contraction,
    aten.baddbmm.default: _contraction,
    aten.native_layer_norm.default: _layer_norm,
    aten.native_layer_norm_backward.default: _layer_norm_backward,
    aten.embedding.default: _embedding,
    aten.embedding_dense_backward.default: _embedding_backward,
    aten.nll_loss_forward.default: _nll,
    aten.nll_loss_backward.default: _nll,
    aten.index_select.default: _gather_like,
    aten.index.Tensor: _index,
    aten.gather.default: _gather_like,
}


def _register_runtime_ops():
    # The backend's own attention ops (compiler.py defines them).
    try:
        _RULES[torch.ops.tpurt.attention.default] = _attention
        _RULES[torch.ops.tpurt.attention_backward.default] = _attention_backward
    except (AttributeError, RuntimeError):
        pass


# --- running a plan -------------------------------------------------------------------


class _Fitted:
    """A graph run as traced (no rule pads it) whose tensor inputs may come
    padded from a forward that ran padded: those are cut to the sizes the
    graph was traced with, at this call's sizes."""

    def __init__(self, gm: torch.fx.GraphModule, run: Callable):
        self.run = run
        self.inputs: list = []
        for node in gm.graph.nodes:
            if node.op != "placeholder":
                continue
            v = node.meta.get("val")
            if isinstance(v, torch.SymInt):
                self.inputs.append(("sym", _expr(v)))
            elif isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape):
                shape = [_expr(d) for d in v.shape]
                self.inputs.append(("tensor", shape, _saved_layout(node.target, shape)))
            else:
                self.inputs.append(("other",))

    def __call__(self, *args):
        valid: dict = {}
        for kind, a in zip(self.inputs, args):
            if kind[0] == "sym" and isinstance(kind[1], sympy.Symbol):
                valid[kind[1]] = int(a)
        given = set(valid)
        for kind, a in zip(self.inputs, args):
            if kind[0] == "tensor":
                for e, d in zip(kind[1], a.shape):
                    if isinstance(e, sympy.Symbol) and e not in given:
                        # A padded input's axis is longer: the smallest is n.
                        valid[e] = min(int(d), valid.get(e, int(d)))
        fixed = list(args)
        for i, (kind, a) in enumerate(zip(self.inputs, args)):
            if kind[0] != "tensor" or not all(x in valid for e in kind[1] for x in e.free_symbols):
                continue
            want = [int(e.subs(valid)) if e.free_symbols else int(e) for e in kind[1]]
            if list(a.shape) == want:
                continue
            comps = kind[2] or [_comps_of_size(e) for e in kind[1]]
            padded = {x: int(_C.shape_bucket(n)) for x, n in valid.items()}

            def at(e, env):
                return int(e.subs(env)) if e.free_symbols else int(e)

            fixed[i] = _cut(a, comps, valid, padded, at)
        return self.run(*fixed)


def _cut(o, comps_list, valid, padded, at):
    """o (padded) cut to its valid lanes: a view where every padded axis
    is one component, else a copy by the runtime."""
    merged = any(len(c) > 1 and _padded_axis(c) for c in comps_list)
    expanded = [at(e, padded) for c in comps_list for e in c]
    if not merged:
        for i, c in enumerate(comps_list):
            if _padded_axis(c):
                o = o.narrow(i, 0, at(_prod(c), valid))
        return o
    big = o.view(expanded)
    for i, n in enumerate(at(e, valid) for c in comps_list for e in c):
        big = big.narrow(i, 0, n)
    out = o.new_empty([at(e, valid) for c in comps_list for e in c])
    if o.device.type == "tpu":
        _C.copy_region(out, big)
    else:
        out.copy_(big)
    return out.view([at(_prod(c), valid) for c in comps_list])


def _view_as(a, comps_list, valid, at):
    """a (not contiguous) split into its components' sizes, as a view
    where its strides allow, else a contiguous copy made by the runtime."""
    sizes = [at(e, valid) for c in comps_list for e in c]
    try:
        return a.view(sizes)
    except RuntimeError:
        c = a.new_empty(a.shape)
        if a.device.type == "tpu":
            _C.copy_region(c, a)
        else:
            c.copy_(a)
        return c.view(sizes)


def _digits_valid(comps: Comps, padded: list, valid: list) -> torch.Tensor:
    """A bool vector over the axis: True at padded lanes."""
    total = 1
    for p in padded:
        total *= p
    idx = torch.arange(total)
    ok = torch.ones(total, dtype=torch.bool)
    for p, v in zip(reversed(padded), reversed(valid)):
        ok &= (idx % p) < v
        idx = idx // p
    return ~ok


class Bucketed:
    """The padded graph and what its calls need; `__call__` takes the
    original graph's arguments and gives its results."""

    def __init__(self, plan: _Plan, run: Callable, exact: Callable, saved_from: Optional[int]):
        self.plan = plan
        self.saved_from = saved_from
        self.run = run
        self.exact = exact
        self.extras_cache: "collections.OrderedDict" = collections.OrderedDict()

    def _solve(self, args) -> dict:
        """Each symbol's size at this call: from a size argument, else the
        smallest size of the tensors' axes it names (a tensor the forward
        saved arrives padded)."""
        vals: dict = {}
        for kind, a in zip(self.plan.inputs, args):
            if kind[0] == "sym" and isinstance(kind[1], sympy.Symbol):
                vals[kind[1]] = int(a)
        seen: dict = {}
        for kind, a in zip(self.plan.inputs, args):
            if kind[0] == "tensor":
                for c, s in zip(kind[1], a.shape):
                    if len(c) == 1 and isinstance(c[0], sympy.Symbol) and c[0] not in vals:
                        seen[c[0]] = min(int(s), seen.get(c[0], int(s)))
        vals.update(seen)
        return vals

    def __call__(self, *args):
        plan = self.plan
        valid = self._solve(args)
        padded = {s: int(_C.shape_bucket(n)) for s, n in valid.items()}
        if all(padded[s] == n for s, n in valid.items()) and _policy_exact():
            return self.exact(*args)

        def at(e, env):
            return int(e.subs(env)) if e.free_symbols else int(e)

        new_args = []
        for kind, a in zip(plan.inputs, args):
            if kind[0] == "sym":
                new_args.append(at(kind[1], padded))
            elif kind[0] == "tensor" and any(_padded_axis(c) for c in kind[1]):
                new_args.append(self._pad(a, kind[1], valid, padded, at))
            else:
                new_args.append(a)
        key = tuple(valid[s] for s in plan.symbols) + tuple(padded[s] for s in plan.symbols)
        extras = self.extras_cache.get(key)
        if extras is None:
            extras = [self._extra(spec, valid, padded, at, args) for spec in plan.extras]
            self.extras_cache[key] = extras
            if len(self.extras_cache) > 64:
                self.extras_cache.popitem(last=False)
        else:
            self.extras_cache.move_to_end(key)
        outs = self.run(*new_args, *extras)
        single = not isinstance(outs, (list, tuple))
        outs_list = [outs] if single else list(outs)
        result = []
        for i, (kind, o) in enumerate(zip(plan.outputs, outs_list)):
            if kind[0] == "sym":
                result.append(at(kind[1], valid))
            elif (
                kind[0] == "tensor"
                and isinstance(o, torch.Tensor)
                and any(_padded_axis(c) for c in kind[1])
                and (self.saved_from is None or i < self.saved_from)
            ):
                result.append(_cut(o, kind[1], valid, padded, at))
            else:
                result.append(o)
        if single:
            return result[0]
        return type(outs)(result) if isinstance(outs, tuple) else result

    def _device(self, args):
        for a in args:
            if isinstance(a, torch.Tensor) and a.device.type == "tpu":
                return a.device
        return torch.device("tpu")

    def _extra(self, spec, valid, padded, at, args):
        device = self._device(args)
        if spec[0] == "value":
            if spec[2]:
                return torch.tensor(float(spec[1].subs(valid)), dtype=torch.float64, device=device)
            return torch.tensor(at(spec[1], valid), dtype=torch.int64, device=device)
        _, rank, axis, comps = spec
        mask = _digits_valid(comps, [at(e, padded) for e in comps], [at(e, valid) for e in comps])
        shape = [1] * rank
        shape[axis] = mask.numel()
        return mask.view(shape).to(device)

    @staticmethod
    def _expanded(comps_list, env, at):
        return [at(e, env) for c in comps_list for e in c]

    def _pad(self, a, comps_list, valid, padded, at):
        shape = [at(_prod(c), padded) for c in comps_list]
        if list(a.shape) == shape:
            # Already padded: a tensor the forward saved for the backward
            # (or a size at its bucket).
            return a
        out = a.new_zeros(shape)
        region = out.view(self._expanded(comps_list, padded, at))
        for i, n in enumerate(self._expanded(comps_list, valid, at)):
            region = region.narrow(i, 0, n)
        src = a.view(self._expanded(comps_list, valid, at)) if a.is_contiguous() else _view_as(a, comps_list, valid, at)
        if a.device.type == "tpu":
            # A strided copy, not an op: an op would be a program per size.
            _C.copy_region(region, src)
        else:
            region.copy_(src)
        return out


def plan(gm: torch.fx.GraphModule) -> tuple[Optional[_Plan], Optional[str]]:
    """The padded form of gm, or None and why it runs exactly."""
    if not any(_symbolic(n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"):
        return None, "no dynamic dimension"
    _register_runtime_ops()
    try:
        return _Builder(gm).run(), None
    except _Unsupported as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - a gap here must not break the user's graph
        return None, f"{type(e).__name__} while padding: {e}"


def wrap(gm: torch.fx.GraphModule, runner: Callable[[Callable], Callable], saved_from: Optional[int] = None) -> Callable:
    """gm's forward, padded to buckets where its dynamic dimensions allow
    (`runner` wraps a graph's forward, e.g. in an eager mode); else exact.
    Outputs from index `saved_from` on are the tensors an AOTAutograd
    forward saves for its backward: they stay padded (the backward, padded
    to the same buckets, takes them as they are) instead of being cut."""
    p, why = plan(gm)
    if p is None:
        exact = runner(gm.forward)
        if why == "no dynamic dimension":
            return exact
        _count(why)
        # A backward whose forward ran padded gets the forward's saved
        # tensors padded: they are cut to their sizes first.
        return _Fitted(gm, exact)
    _count(None)
    if saved_from is not None:
        for name, shape, comps in p.output_names:
            _remember_saved(name, shape, comps)
    return Bucketed(p, runner(p.gm.forward), runner(gm.forward), saved_from)


def _policy_exact() -> bool:
    """Whether the policy maps every size to itself (then the graph runs
    as traced, without masks)."""
    return all(int(_C.shape_bucket(n)) == n for n in (1, 3, 5, 7))
