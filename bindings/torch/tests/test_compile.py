"""torch.compile(backend="tpu") and Transformers' static-cache generate,
which compiles with it."""

import pytest
import torch

import tpurt.compiler  # noqa: F401


def test_compiled_module_matches_eager_cpu_and_does_not_recompile(no_fallback):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    dev = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
    dev.load_state_dict(ref.state_dict())
    compiled = torch.compile(dev, backend="tpu")
    x = torch.randn(8, 16)
    out = compiled(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), ref(x).detach(), atol=1e-5, rtol=1e-5)
    out.sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(dev[0].weight.grad.cpu(), ref[0].weight.grad, atol=1e-5, rtol=1e-5)
    before = torch.tpu.compile_cache_stats()
    for _ in range(3):
        compiled(x.to("tpu")).sum().item()
    after = torch.tpu.compile_cache_stats()
    assert after["misses"] == before["misses"]


def test_compiled_products_take_the_precision_in_force_when_called(no_fallback):
    # The same compiled function, called under another precision, computes
    # at that one (the host rounds the operands as a TPU does).
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(8, 64, generator=g), torch.randn(32, 64, generator=g)
    f = torch.compile(lambda x, w: torch.nn.functional.linear(x, w).relu(), backend="tpu")
    xt, wt = x.to("tpu"), w.to("tpu")
    full = f(xt, wt).cpu()
    with torch.tpu.precision("medium"):
        low = f(xt, wt).cpu()
    torch.testing.assert_close(full, torch.nn.functional.linear(x, w).relu())
    if torch.tpu.platform() == "host":
        bf = lambda v: v.to(torch.bfloat16).float()  # noqa: E731
        torch.testing.assert_close(low, torch.nn.functional.linear(bf(x), bf(w)).relu(), rtol=1e-5, atol=1e-5)
        assert (low - full).abs().max() > 1e-3
    torch.testing.assert_close(f(xt, wt).cpu(), full)


def _count_rewrites(monkeypatch) -> list[int]:
    """How many attention calls each compile rewrote to the runtime's op."""
    import tpurt.compiler as c

    counts: list[int] = []
    original = c._rewrite_attention

    def counting(gm):
        counts.append(original(gm))
        return counts[-1]

    monkeypatch.setattr(c, "_rewrite_attention", counting)
    torch._dynamo.reset()
    return counts


def test_compiled_attention_over_a_transposed_query_trains(no_fallback, monkeypatch):
    # As Llama lays out heads: the query is an elementwise result of a
    # transposed view, and the attention output is viewed back. Traced
    # through torch's fused attention op, the graph's view expected the
    # layout torch's stride propagation gives that query, which tpu
    # results do not have ("view size is not compatible"); the backend's
    # own attention op gives contiguous results, traced and run.
    import torch.nn.functional as F

    rewrites = _count_rewrites(monkeypatch)

    def block(x, w):
        q = (x.view(2, 12, 4, 8).transpose(1, 2) * 2.0).sin()
        k = x.view(2, 12, 4, 8).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, k, is_causal=True)
        return out.transpose(1, 2).reshape(2, 12, 32).view(24, 32) @ w

    torch.manual_seed(0)
    x, w = torch.randn(2, 12, 32, requires_grad=True), torch.randn(32, 5, requires_grad=True)
    ref = block(x, w)
    gx, gw = torch.autograd.grad(ref.square().sum(), (x, w))
    xt, wt = (t.detach().to("tpu").requires_grad_() for t in (x, w))
    out = torch.compile(block, backend="tpu")(xt, wt)
    dx, dw = torch.autograd.grad(out.square().sum(), (xt, wt))
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dx.cpu(), gx, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dw.cpu(), gw, atol=1e-4, rtol=1e-4)
    # Eager on tpu (the runtime's attention op) gives the same.
    eager = block(xt, wt)
    torch.testing.assert_close(eager.detach().cpu(), ref.detach(), atol=1e-4, rtol=1e-4)
    assert rewrites == [1]


def test_compiled_attention_with_grouped_heads_or_a_mask(no_fallback, monkeypatch):
    # Grouped key/value heads (enable_gqa) run the runtime's op; a mask is
    # traced to torch's math decomposition. Both train as on the CPU.
    import torch.nn.functional as F

    rewrites = _count_rewrites(monkeypatch)

    def gqa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=0.3)

    def masked(q, k, v):
        mask = torch.ones(6, 6, dtype=torch.bool, device=q.device).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    torch.manual_seed(0)
    shapes = {gqa: [(2, 4, 6, 8), (2, 2, 6, 8), (2, 2, 6, 8)], masked: [(2, 2, 6, 8)] * 3}
    for fn, dims in shapes.items():
        cpu = [torch.randn(d, requires_grad=True) for d in dims]
        ref = fn(*cpu)
        grads = torch.autograd.grad(ref.square().sum(), cpu)
        dev = [t.detach().to("tpu").requires_grad_() for t in cpu]
        out = torch.compile(fn, backend="tpu")(*dev)
        got = torch.autograd.grad(out.square().sum(), dev)
        torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=1e-4, rtol=1e-4)
        for g, r in zip(got, grads):
            torch.testing.assert_close(g.cpu(), r, atol=1e-4, rtol=1e-4)
    assert rewrites == [1, 0]


def test_static_cache_generate_compiled_with_backend_tpu(no_fallback):
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )
    torch.manual_seed(0)
    cpu = transformers.LlamaForCausalLM(cfg).eval()
    dev = transformers.LlamaForCausalLM(cfg).eval()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("tpu")
    ids = torch.randint(1, 96, (1, 6), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    ref = cpu.generate(ids, **kw)
    out = dev.generate(
        ids.to("tpu"), cache_implementation="static",
        compile_config=transformers.CompileConfig(backend="tpu"), **kw,
    )
    assert torch.equal(out.cpu(), ref)


def test_compiler_options_merge_restore_and_reject_bad_values():
    opts = torch.tpu.compiler
    assert opts.compiler_options() == {}
    with opts.custom_compiler_options({"xla_a": 1}):
        with opts.custom_compiler_options({"xla_b": "x", "xla_a": 2.5}) as inner:
            assert opts.compiler_options() == {"xla_a": 2.5, "xla_b": "x"}
            assert inner.prev == {"xla_a": 1}
        assert opts.compiler_options() == {"xla_a": 1}
    assert opts.compiler_options() == {}
    with pytest.raises(TypeError, match="dict of names"):
        opts.custom_compiler_options(["xla_a"])
    with pytest.raises(ValueError, match="compiler options"):
        opts.custom_compiler_options({"xla_a": float("nan")})
    with pytest.raises(RuntimeError, match="is not a boolean, a number or a string"):
        opts.custom_compiler_options({"xla_a": [1]})
    assert opts.compiler_options() == {}


def _bf16_chain(x):
    y = x * 1.0013
    for _ in range(6):
        y = (y + 0.3137) * 0.7071
    return y


def test_allow_excess_precision_is_xlas_and_off_by_default():
    # Off, a fused bf16 chain rounds after every op, as torch; on, XLA
    # keeps f32 inside the fusion (the host has no such option).
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)).bfloat16()
    want = _bf16_chain(x)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        exact = _bf16_chain(x.to("tpu")).cpu()
        def not_in_memory():
            st = torch.tpu.compile_cache_stats()
            return st["requests"] - st["memory_hits"]

        before = not_in_memory()
        with torch.tpu.allow_excess_precision():
            excess = _bf16_chain(x.to("tpu")).cpu()
        assert not_in_memory() > before  # another key: compiled, or loaded from disk
        again = _bf16_chain(x.to("tpu")).cpu()
    assert torch.equal(exact, want) and torch.equal(again, want)
    if torch.tpu.platform() == "xla":
        assert (excess != want).sum() > 100
        torch.testing.assert_close(excess, want, rtol=2e-2, atol=2e-2)
    else:
        assert torch.equal(excess, want)


def test_an_unknown_xla_option_fails_naming_it():
    x = torch.ones(3, device="tpu")
    with torch.tpu.compiler.custom_compiler_options({"xla_no_such_option": 1}):
        if torch.tpu.platform() == "xla":
            with pytest.raises(RuntimeError, match="No such compile option: 'xla_no_such_option'"):
                (x * 3.5).cpu()
        else:
            assert (x * 3.5).cpu().tolist() == [3.5] * 3
    assert (x * 3.5).cpu().tolist() == [3.5] * 3
