"""The main job: train a tiny Llama (Transformers, built from a config, no
download) on `tpu` under defer-and-fuse, then report the loss curve, the
step time against the same model on torch CPU eager, compile-cache hits and
misses, and peak HBM.

    .venv/bin/python examples/train_llama.py [--steps 30] [--mode defer_and_fuse]

The platform is TPURT_PLATFORM's (default: host, the emulated TPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import transformers

import tpurt  # noqa: F401  (registers tpu when torch's autoload is off)


def config() -> transformers.LlamaConfig:
    # The Llama training step of ../shared/ANCHORS.md (hidden 256, 4 layers,
    # 8 heads, 4 kv heads, vocab 1024).
    return transformers.LlamaConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
    )


def batches(steps: int, batch: int, seq: int, vocab: int) -> list[torch.Tensor]:
    """Synthetic sequences with structure to learn: each token is the one
    before it plus a per-sequence stride, modulo the vocabulary."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        stride = torch.randint(1, 4, (batch, 1), generator=g)
        out.append((start + stride * torch.arange(seq)) % vocab)
    return out


def train(
    device: str, data: list[torch.Tensor], bar: bool, backend: str | None = None
) -> tuple[list[float], list[float]]:
    """Train a fresh model on `data`; the loss function goes through
    torch.compile with `backend` when one is given. Returns the losses and
    the step times (s)."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config()).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def loss_of(ids):
        return model(input_ids=ids, labels=ids).loss

    step = loss_of if backend is None else torch.compile(loss_of, backend=backend)
    losses, times = [], []
    for i, ids in enumerate(data):
        t0 = time.perf_counter()
        ids = ids.to(device)
        opt.zero_grad(set_to_none=True)
        loss = step(ids)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # a host read: the step's work is done
        times.append(time.perf_counter() - t0)
        if bar:
            done = int(30 * (i + 1) / len(data))
            sys.stdout.write(
                f"\r  {device:4} [{'#' * done}{'.' * (30 - done)}] step {i + 1}/{len(data)} "
                f"loss {losses[-1]:.3f} {times[-1] * 1e3:7.1f} ms"
            )
            sys.stdout.flush()
    if bar:
        sys.stdout.write("\n")
    return losses, times


def sparkline(values: list[float]) -> str:
    ticks = "▁▂▃▄▅▆▇█"
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(ticks[min(7, int((v - lo) / span * 7.999))] for v in values)


def measure(steps: int, cpu_steps: int, batch: int = 8, seq: int = 128) -> dict:
    """Steady-state step times (ms, medians) on tpu under defer-and-fuse
    and on torch CPU eager, for bench/torch_bench.py."""
    data = batches(steps, batch, seq, config().vocab_size)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        _, times = train("tpu", data, bar=False)
    _, cpu_times = train("cpu", data[:cpu_steps], bar=False)
    return {
        "tpu_ms": statistics.median(times[2:]) * 1e3,
        "cpu_ms": statistics.median(cpu_times[1:]) * 1e3,
        "first_ms": times[0] * 1e3,
    }


def measure_compiled(device: str, backend: str, steps: int, batch: int = 8, seq: int = 128) -> dict:
    """A torch.compile'd training step on `device` with `backend`: the first
    step's time (compiles included) and the steady-state median (ms)."""
    data = batches(steps, batch, seq, config().vocab_size)
    _, times = train(device, data, bar=False, backend=backend)
    return {"first_ms": times[0] * 1e3, "steady_ms": statistics.median(times[2:]) * 1e3}


def measure_eager(device: str, steps: int, batch: int = 8, seq: int = 128) -> dict:
    """An eager training step on `device` (the thread's eager mode): the
    steady-state median (ms), the first step left out."""
    data = batches(steps, batch, seq, config().vocab_size)
    _, times = train(device, data, bar=False)
    return {"steady_ms": statistics.median(times[1:]) * 1e3}


def measure_first_step(batch: int = 8, seq: int = 128) -> dict:
    """The first training step of a fresh process on tpu (defer-and-fuse),
    in ms: what the compile cache's state decides."""
    data = batches(1, batch, seq, config().vocab_size)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        _, times = train("tpu", data, bar=False)
    return {"first_ms": times[0] * 1e3, "cache": torch.tpu.compile_cache_stats()}


def lengths_sweep(steps: int = 16, batch: int = 8, low: int = 16, high: int = 256) -> list[int]:
    """A fixed pseudo-random run of sequence lengths (a corpus without
    packing), the same in every process."""
    g = torch.Generator().manual_seed(1)
    return torch.randint(low, high + 1, (steps,), generator=g).tolist()


def measure_lengths(device: str, backend: str, batch: int = 8) -> dict:
    """A compiled training step over `lengths_sweep()` (dynamo makes the
    sequence dimension dynamic at the second length): the whole run's
    time (s, compiles included) and the compile cache's misses on tpu."""
    vocab = config().vocab_size
    data = [batches(1, batch, n, vocab)[0] for n in lengths_sweep(batch=batch)]
    before = torch.tpu.compile_cache_stats()["misses"] if device == "tpu" else 0
    t0 = time.perf_counter()
    _, times = train(device, data, bar=False, backend=backend)
    total = time.perf_counter() - t0
    misses = torch.tpu.compile_cache_stats()["misses"] - before if device == "tpu" else 0
    return {"total_s": total, "steps_s": sum(times), "misses": misses}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--cpu-steps", type=int, default=8, help="steps of the torch CPU eager baseline")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--mode", default="defer_and_fuse",
                    choices=[m.name.lower() for m in torch.tpu.EagerMode])
    args = ap.parse_args()

    mode = torch.tpu.EagerMode[args.mode.upper()]
    cfg = config()
    print(f"tiny Llama: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, "
          f"{cfg.num_attention_heads} heads ({cfg.num_key_value_heads} kv), vocab {cfg.vocab_size}; "
          f"batch {args.batch} x seq {args.seq}; AdamW")
    print(f"device tpu on platform {torch.tpu.platform()!r} ({torch.tpu.device_count()} chips), "
          f"eager mode {mode.name}")
    data = batches(args.steps, args.batch, args.seq, cfg.vocab_size)
    torch.tpu.reset_peak_memory_stats()
    before = torch.tpu.compile_cache_stats()
    with torch.tpu.set_eager_mode(mode):
        losses, times = train("tpu", data, bar=True)
    after = torch.tpu.compile_cache_stats()
    peak = torch.tpu.max_memory_allocated()
    fallbacks = torch.tpu.fallback_stats()

    torch.set_num_threads(max(1, torch.get_num_threads()))
    _, cpu_times = train("cpu", data[: args.cpu_steps], bar=True)

    warm = times[2:] if len(times) > 4 else times
    ours = statistics.median(warm)
    peer = statistics.median(cpu_times[1:] if len(cpu_times) > 2 else cpu_times)
    print()
    print(f"loss       {losses[0]:.3f} -> {losses[-1]:.3f}   {sparkline(losses)}")
    print(f"first step {times[0] * 1e3:8.1f} ms (compiles included)")
    print(f"step time  {ours * 1e3:8.1f} ms on tpu (median of steps 3..{len(times)}), "
          f"{peer * 1e3:.1f} ms on torch CPU eager: ratio {peer / ours:.2f} (above 1: tpu faster)")
    hits = after["hits"] - before["hits"]
    misses = after["misses"] - before["misses"]
    print(f"compile cache: {hits} hits, {misses} misses "
          f"({after['compile_seconds'] - before['compile_seconds']:.2f} s compiling)")
    print(f"peak HBM   {peak / (1 << 20):8.1f} MiB on tpu:0")
    print(f"CPU fallback calls: {sum(fallbacks.values())}" + (f" {fallbacks}" if fallbacks else ""))
    if len(losses) >= 10 and not statistics.mean(losses[-3:]) < losses[0]:
        sys.exit("the loss did not go down")


if __name__ == "__main__":
    main()
