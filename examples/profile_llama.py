"""Where a training step of the README's tiny Llama spends its device time:
torch.tpu.profiler over a few steps under defer-and-fuse, then how busy the
TensorCore executor was, the kernel time per step by kind (matrix products,
attention, row kernels, loop kernels, the rest), the kernels by total time,
and the longest tasks. With --torch, the same steps on torch CPU eager
under torch.profiler, by the same kinds, to set the two side by side.

    .venv/bin/python examples/profile_llama.py [--steps 8] [--torch] [--trace trace.json]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_llama  # noqa: E402


# Kinds of work, by kernel name on tpu and by aten op on torch CPU.
KINDS = ("matrix products", "attention", "row kernels", "loop kernels", "other")


def tpu_kind(name: str) -> str:
    if name.startswith("dot_general"):
        return "matrix products"
    if name.startswith("attention"):
        return "attention"
    if name.startswith("rows "):
        return "row kernels"
    if name.startswith("loop "):
        return "loop kernels"
    return "other"


def torch_kind(name: str) -> str:
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"):
        return "matrix products"
    if "scaled_dot_product" in name:
        return "attention"
    return "other"


def by_kind(times: dict) -> str:
    total = sum(times.values())
    return "\n".join(f"  {k:16} {times.get(k, 0.0):8.1f} ms  {times.get(k, 0.0) / total * 100:5.1f}%"
                      for k in KINDS if k in times) + f"\n  {'total':16} {total:8.1f} ms"


def torch_eager(steps: int) -> None:
    """The same steps on torch CPU eager: self CPU time per step by kind
    (an op's self time is its wall time on the calling thread, its
    intra-op threads included)."""
    import transformers
    from torch.profiler import ProfilerActivity, profile

    data = train_llama.batches(steps + 3, 8, 128, train_llama.config().vocab_size)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(train_llama.config())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def step(ids):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss.item()

    for ids in data[:3]:
        step(ids)
    times = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for ids in data[3:]:
            t0 = time.perf_counter()
            step(ids)
            times.append(time.perf_counter() - t0)
    kinds: dict = {}
    for e in prof.key_averages():
        k = torch_kind(e.key)
        kinds[k] = kinds.get(k, 0.0) + e.self_cpu_time_total / 1e3 / steps
    print(f"torch CPU eager: median step {statistics.median(times) * 1e3:.1f} ms (under torch.profiler)")
    print("self CPU time per step by kind:")
    print(by_kind(kinds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rows", type=int, default=25, help="kernel rows to print")
    ap.add_argument("--trace", help="also write a Chrome trace here")
    ap.add_argument("--torch", action="store_true", help="also profile torch CPU eager's steps")
    args = ap.parse_args()
    data = train_llama.batches(args.steps + 3, 8, 128, train_llama.config().vocab_size)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        train_llama.train("tpu", data[:3], bar=False)  # warm-up: compiles
        with torch.tpu.profiler.profile() as prof:
            t0 = time.perf_counter()
            _, times = train_llama.train("tpu", data[3:], bar=False)
            wall = time.perf_counter() - t0
    tasks = [e for e in prof.events() if e.kind == "task" and e.thread.endswith("-tc")]
    busy = sum(e.duration_us for e in tasks) / 1e3
    span = (max(e.start_us + e.duration_us for e in tasks) - min(e.start_us for e in tasks)) / 1e3
    print(f"{args.steps} steps in {wall * 1e3:.0f} ms, median step {statistics.median(times) * 1e3:.1f} ms")
    print(f"TensorCore executor busy {busy:.0f} ms of {span:.0f} ms ({busy / span * 100:.0f}%), {len(tasks)} tasks")
    kinds: dict = {}
    for e in prof.events():
        if e.kind == "kernel":
            k = tpu_kind(e.name)
            kinds[k] = kinds.get(k, 0.0) + e.duration_us / 1e3 / args.steps
    print("kernel time per step by kind:")
    print(by_kind(kinds))
    print(prof.key_averages("kernel").table(row_limit=args.rows, max_name_width=70))
    print("longest tasks:")
    for e in sorted(tasks, key=lambda e: -e.duration_us)[:5]:
        print(f"  {e.duration_us / 1e3:8.2f} ms  {e.name[:90]}")
    if args.trace:
        prof.export_chrome_trace(args.trace)
        print(f"Chrome trace: {args.trace}")
    if args.torch:
        torch_eager(args.steps)


if __name__ == "__main__":
    main()
