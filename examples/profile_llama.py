"""Where a training step of the README's tiny Llama spends its device time:
torch.tpu.profiler over a few steps under defer-and-fuse, then how busy the
TensorCore executor was, the kernels by total time, and the longest tasks.

    .venv/bin/python examples/profile_llama.py [--steps 8] [--trace trace.json]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_llama  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rows", type=int, default=25, help="kernel rows to print")
    ap.add_argument("--trace", help="also write a Chrome trace here")
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
    print(prof.key_averages("kernel").table(row_limit=args.rows, max_name_width=70))
    print("longest tasks:")
    for e in sorted(tasks, key=lambda e: -e.duration_us)[:5]:
        print(f"  {e.duration_us / 1e3:8.2f} ms  {e.name[:90]}")
    if args.trace:
        prof.export_chrome_trace(args.trace)
        print(f"Chrome trace: {args.trace}")


if __name__ == "__main__":
    main()
