"""PyTorch-level benchmarks of the tpu device, each against its peer in the
same run: one JSON object per line (name, ours, peer, peer_name, unit,
ratio = peer / ours; above 1 means tpu is faster).

    .venv/bin/python bench/torch_bench.py [NAME...] [--list]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import tpurt  # noqa: F401
from rows import chosen, row

ROOT = Path(__file__).resolve().parent.parent


# Each side runs a block of calls before the other side's block, and the
# medians are over single calls: torch's OpenMP workers spin for a while
# after a parallel region (libgomp's default; rayon's workers too), so the
# first call or two after a switch shares the cores with the other side's
# spinning threads (our attention ran 10.4 ms per call right after torch's
# SDPA, one call each in turn, and 6.6 ms with OMP_WAIT_POLICY=PASSIVE).
# The median leaves those calls out; pausing between calls instead would
# time threads waking from sleep on both sides.
BLOCK = 5


def interleaved(a, b, rounds: int, block: int = BLOCK) -> tuple[float, float]:
    """Medians of single calls of a() and b(), run in alternating blocks
    so both see the same noise."""
    ta, tb = [], []
    for _ in range(rounds):
        for f, times in ((a, ta), (b, tb)):
            for _ in range(block):
                t0 = time.perf_counter()
                f()
                times.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def tiny_add() -> None:
    """Dispatch overhead: x + y on 16 floats, strict mode, 2000 ops per
    round (the work is queued; one sync per round)."""
    n = 2000
    xt, yt = torch.ones(16, device="tpu"), torch.ones(16, device="tpu")
    xc, yc = torch.ones(16), torch.ones(16)

    def on_tpu():
        for _ in range(n):
            xt + yt
        torch.tpu.synchronize()

    def on_cpu():
        for _ in range(n):
            xc + yc

    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        on_tpu()
        ours, peer = interleaved(on_tpu, on_cpu, 8)
    row("torch_tiny_add_16_strict", ours / n * 1e6, peer / n * 1e6, "torch CPU eager", "us/op")


def sdpa_forward() -> None:
    """scaled_dot_product_attention forward at the attention block's shape
    of ANCHORS.md (q, k, v 8x8x256x64 f32, no mask): the runtime's
    attention op on tpu (strict, synchronized) against torch's CPU SDPA."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    q, k, v = (torch.randn(8, 8, 256, 64) for _ in range(3))
    qt, kt, vt = (t.to("tpu") for t in (q, k, v))

    def on_tpu():
        F.scaled_dot_product_attention(qt, kt, vt)
        torch.tpu.synchronize()

    def on_cpu():
        F.scaled_dot_product_attention(q, k, v)

    on_tpu()
    on_cpu()
    ours, peer = interleaved(on_tpu, on_cpu, 8)
    row("torch_sdpa_forward_8x8x256x64", ours * 1e3, peer * 1e3, "torch CPU SDPA", "ms")


def sdpa_train() -> None:
    """Causal grouped-query attention forward and backward at the Llama
    step's shape (q 8x8x128x32, k and v 8x4x128x32): tpu against torch's
    CPU SDPA (its flash kernel)."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    q, g = torch.randn(8, 8, 128, 32), torch.randn(8, 8, 128, 32)
    k, v = torch.randn(8, 4, 128, 32), torch.randn(8, 4, 128, 32)

    def step(q, k, v, g):
        def run():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            torch.autograd.grad(out, (q, k, v), g)
        return run

    on_cpu = step(*(t.clone().requires_grad_() for t in (q, k, v)), g)
    inner = step(*(t.to("tpu").requires_grad_() for t in (q, k, v)), g.to("tpu"))

    def on_tpu():
        inner()
        torch.tpu.synchronize()

    on_tpu()
    on_cpu()
    ours, peer = interleaved(on_tpu, on_cpu, 8)
    row("torch_sdpa_causal_gqa_fwd_bwd_8x8x128x32", ours * 1e3, peer * 1e3,
        "torch CPU SDPA (flash kernel)", "ms")


def block_a(x, b):
    """ANCHORS' block (a): bias + GELU(erf) + dropout(0.1) + residual +
    layer_norm over the last dim."""
    import torch.nn.functional as F

    h = F.gelu(x + b)
    h = F.dropout(h, p=0.1, training=True)
    return F.layer_norm(h + x, (x.shape[-1],))


def block_b(q, k, v):
    """ANCHORS' block (b): softmax(q k^T / 8) v, written out (no SDPA)."""
    return torch.softmax(q @ k.transpose(-2, -1) / 8, dim=-1) @ v


def block_rows(name: str, block, shapes, rounds: int = 6) -> None:
    """One block on tpu under defer-and-fuse (synchronized each call)
    against the same block on torch CPU eager and compiled by inductor on
    CPU: two rows, each pair interleaved in the same run."""
    torch.manual_seed(0)
    cpu = [torch.randn(*s) for s in shapes]
    tpu = [t.to("tpu") for t in cpu]
    compiled = torch.compile(block, backend="inductor")

    def on_tpu():
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            out = block(*tpu)
        torch.tpu.synchronize()
        return out

    with torch.no_grad():
        for _ in range(2):
            on_tpu(), block(*cpu), compiled(*cpu)
        ours, eager = interleaved(on_tpu, lambda: block(*cpu), rounds)
        row(f"{name}_vs_eager", ours * 1e3, eager * 1e3, "torch CPU eager", "ms")
        ours, inductor = interleaved(on_tpu, lambda: compiled(*cpu), rounds)
        row(f"{name}_vs_inductor", ours * 1e3, inductor * 1e3,
            "torch.compile inductor on CPU", "ms")


def blocks() -> None:
    """ANCHORS' two blocks through the PyTorch binding, at its shapes."""
    block_rows("torch_block_bias_gelu_dropout_residual_layernorm_4096x1024", block_a,
               [(4096, 1024), (1024,)])
    block_rows("torch_block_softmax_attention_8x8x256x64", block_b, [(8, 8, 256, 64)] * 3)


def llama_step(platform: str) -> None:
    """The Llama training step of ANCHORS.md under defer-and-fuse, in a
    child process (the platform is chosen per process), against torch CPU
    eager in the same child, and against inductor's steady-state step."""
    r = child("print(json.dumps(t.measure(steps=10, cpu_steps=6)))", {"TPURT_PLATFORM": platform})
    row(f"torch_llama_train_step_defer_{platform}", r["tpu_ms"], r["cpu_ms"], "torch CPU eager", "ms/step")
    row(f"torch_llama_train_step_defer_{platform}_vs_inductor", r["tpu_ms"],
        inductor_step()["steady_ms"], "torch.compile inductor on CPU", "ms/step")


_INDUCTOR_STEP: dict = {}


def inductor_step() -> dict:
    """Inductor's Llama step on CPU (first and steady-state ms), measured
    once per run of this script and shared by the rows that need it."""
    if not _INDUCTOR_STEP:
        _INDUCTOR_STEP.update(
            cold_inductor("print(json.dumps(t.measure_compiled('cpu', 'inductor', steps=8)))"))
    return _INDUCTOR_STEP


def child(code: str, env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", "import json, sys; sys.path.insert(0, 'examples');"
                          " import train_llama as t; import torch; " + code],
                         cwd=ROOT, env=dict(os.environ, **(env or {})), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cold_inductor(code: str) -> dict:
    """A child running inductor with an empty cache directory of its own,
    so its first step pays the whole compile (as a first run does)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return child(code, {"TORCHINDUCTOR_CACHE_DIR": d})


def llama_compiled() -> None:
    """torch.compile(backend="tpu") on tpu against inductor on CPU, both
    compiling the same loss function; steady-state steps."""
    ours = child("print(json.dumps(t.measure_compiled('tpu', 'tpu', steps=8)))")
    peer = inductor_step()
    eager = child("print(json.dumps(t.measure_eager('cpu', steps=6)))")
    row("torch_llama_train_step_compiled", ours["steady_ms"], peer["steady_ms"],
        "torch.compile inductor on CPU", "ms/step")
    row("torch_llama_train_step_compiled_vs_eager", ours["steady_ms"], eager["steady_ms"],
        "torch CPU eager", "ms/step")
    row("torch_llama_first_compiled_step", ours["first_ms"], peer["first_ms"],
        "torch.compile inductor on CPU (first step)", "ms")


def llama_first_step() -> None:
    """A fresh process's first training step on tpu with an empty compile
    cache directory and with a warm one, against inductor's first step on
    CPU (its compile included)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        env = {"TPURT_CACHE_DIR": d}
        cold = child("print(json.dumps(t.measure_first_step()))", env)
        warm = child("print(json.dumps(t.measure_first_step()))", env)
    peer = cold_inductor("print(json.dumps(t.measure_compiled('cpu', 'inductor', steps=3)))")
    row("torch_llama_first_step_cold_cache", cold["first_ms"], peer["first_ms"],
        "torch.compile inductor on CPU (first step)", "ms")
    row("torch_llama_first_step_warm_cache", warm["first_ms"], peer["first_ms"],
        "torch.compile inductor on CPU (first step)", "ms")


def llama_lengths() -> None:
    """torch.compile'd training steps over a run of 16 sequence lengths
    from 16 to 256 (train_llama.lengths_sweep), compiles included, on each
    platform: tpu with shape buckets (the default) against tpu with every
    length its own programs, and against inductor on CPU with its own
    dynamic shapes."""
    import tempfile

    peer = cold_inductor("print(json.dumps(t.measure_lengths('cpu', 'inductor')))")
    for platform in ("host", "xla"):
        runs = {}
        for buckets in ("pow2", "off"):
            with tempfile.TemporaryDirectory() as d:
                env = {"TPURT_PLATFORM": platform, "TPURT_CACHE_DIR": d, "TPURT_SHAPE_BUCKETS": buckets}
                runs[buckets] = child("print(json.dumps(t.measure_lengths('tpu', 'tpu')))", env)
        ours, exact = runs["pow2"], runs["off"]
        row(f"torch_llama_dynamic_lengths_{platform}_vs_no_buckets", ours["total_s"], exact["total_s"],
            f"tpu without shape buckets ({exact['misses']} programs against {ours['misses']})", "s")
        row(f"torch_llama_dynamic_lengths_{platform}_vs_inductor", ours["total_s"], peer["total_s"],
            "torch.compile inductor on CPU, dynamic shapes", "s")


def linalg() -> None:
    """Linear algebra on tpu (strict, synchronized) against torch's CPU
    LAPACK: one 256 x 256 f32 solve with 16 right-hand sides (LU with
    partial pivoting, two triangular solves), the inverses of 1024 batched
    4 x 4 f32 matrices (what pose and camera code inverts), a 256 x 64
    reduced QR, the eigendecomposition of a 128 x 128 symmetric matrix and
    the SVD of a 256 x 64 one (Jacobi's method on tpu, LAPACK's syevd and
    gesdd on CPU)."""
    g = torch.Generator().manual_seed(0)
    cases = [
        ("torch_linalg_solve_256x256_f32", torch.linalg.solve,
         (torch.randn(256, 256, generator=g) + 16 * torch.eye(256), torch.randn(256, 16, generator=g))),
        ("torch_linalg_inv_batch_1024x4x4_f32", torch.linalg.inv,
         (torch.randn(1024, 4, 4, generator=g) + 4 * torch.eye(4),)),
        ("torch_linalg_qr_256x64_f32", torch.linalg.qr, (torch.randn(256, 64, generator=g),)),
        ("torch_linalg_eigh_128_f32", torch.linalg.eigh,
         ((lambda a: a + a.mT)(torch.randn(128, 128, generator=g)),)),
        ("torch_linalg_svd_256x64_f32", lambda a: torch.linalg.svd(a, full_matrices=False),
         (torch.randn(256, 64, generator=g),)),
    ]
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        for name, f, args in cases:
            on = tuple(a.to("tpu") for a in args)

            def on_tpu():
                f(*on)
                torch.tpu.synchronize()

            def on_cpu():
                f(*args)

            on_tpu()
            on_cpu()
            ours, peer = interleaved(on_tpu, on_cpu, 8)
            row(name, ours * 1e3, peer * 1e3, "torch CPU (LAPACK)", "ms")


BENCHES = {
    "torch_tiny_add_16_strict": tiny_add,
    "torch_sdpa_forward_8x8x256x64": sdpa_forward,
    "torch_sdpa_causal_gqa_fwd_bwd_8x8x128x32": sdpa_train,
    "torch_blocks": blocks,
    "torch_llama_train_step_defer_host": lambda: llama_step("host"),
    "torch_llama_train_step_defer_xla": lambda: llama_step("xla"),
    "torch_llama_compiled": llama_compiled,
    "torch_llama_first_step": llama_first_step,
    "torch_llama_dynamic_lengths": llama_lengths,
    "torch_linalg": linalg,
}


def main() -> None:
    for name in chosen(BENCHES, sys.argv[1:]) or []:
        BENCHES[name]()


if __name__ == "__main__":
    main()
