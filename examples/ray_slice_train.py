"""Data-parallel training of a tiny Llama (Transformers) over every chip of
an emulated TPU slice of 2 hosts x 4 chips, with Ray.

    .venv/bin/python examples/ray_slice_train.py [--steps 12] [--kill-host-at 6]

A Ray cluster starts on this machine with one node per host of a v4 2x2x2
slice (tpurt_ray.emulate: the nodes carry the TPU_* variables of TPU VMs,
so Ray's TPU support places the slice as it would a real one). A TpuSlice
puts one actor on each host; each actor keeps a replica of the model on
each of its 4 chips, and every step averages the gradients over all 8
(on the device within a host, through host memory with gloo across hosts).
With --kill-host-at N, host 1's process dies in step N: the slice restarts
that host, every host reloads the last checkpoint, and training goes on to
the same final parameters. Nothing contacts a network host.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import ray  # noqa: E402
import ray.cloudpickle  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from tpurt_ray import TpuSlice  # noqa: E402
from tpurt_ray.emulate import add_slice  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

VOCAB, SEQ, BATCH_PER_CHIP = 64, 16, 4


def setup(ctx, checkpoint):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tpurt_ray.dp import SliceDataParallel

    def make_model():
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=SEQ,
        )
        return LlamaForCausalLM(config)

    ctx.state["dp"] = SliceDataParallel(
        ctx, make_model, lambda p: torch.optim.AdamW(p, lr=3e-3), checkpoint
    )


def step(ctx, i, kill_at=None, marker=None):
    import torch

    if kill_at is not None and i == kill_at and ctx.worker_id == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)

    def loss_fn(model, rank):
        # Each chip its own share of the batch: sequences that count up by
        # a stride, which a tiny model learns in a few steps.
        g = torch.Generator().manual_seed(10_000 * i + rank)
        start = torch.randint(0, VOCAB, (BATCH_PER_CHIP, 1), generator=g)
        stride = torch.randint(1, 4, (BATCH_PER_CHIP, 1), generator=g)
        ids = (start + stride * torch.arange(SEQ)) % VOCAB
        ids = ids.to(next(model.parameters()).device)
        return model(input_ids=ids, labels=ids).loss

    return ctx.state["dp"].step(loss_fn)


def save(ctx):
    return ctx.state["dp"].state_dict()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--kill-host-at", type=int, default=None, help="host 1's process dies in this step")
    ap.add_argument("--checkpoint-every", type=int, default=2)
    args = ap.parse_args()

    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        emulated = add_slice(cluster, "2x2x2", "v4")
        print(f"cluster up: {emulated.shape.num_hosts} emulated TPU hosts of slice {emulated.name} "
              f"({emulated.shape.pod_type}, {emulated.shape.topology}) in {time.perf_counter() - t0:.1f} s")
        with TpuSlice("2x2x2", "v4") as s:
            print(f"slice formed in {s.startup_s:.1f} s:")
            for info in s.host_info:
                print(f"  host {info['worker_id']}: chips {info['host_chips']} at {info['coords']} "
                      f"({info['platform']} platform, pid {info['pid']})")
            marker = tempfile.mktemp(prefix="tpurt-kill-")
            fn = functools.partial(step, kill_at=args.kill_host_at, marker=marker)

            seen = set()

            def on_step(i, results):
                again = "  (again, from the checkpoint)" if i in seen else ""
                seen.add(i)
                print(f"step {i:3d}  loss {results[0]:.4f}{again}")

            out = s.train(setup, fn, save, steps=args.steps, checkpoint_every=args.checkpoint_every,
                          policy="host", on_step=on_step)
            for e in s.events:
                if e["event"] in ("host failed", "recovering", "recovered", "resuming"):
                    fields = {k: v for k, v in e.items() if k not in ("time", "event", "slice")}
                    print(f"event: {e['event']} {fields}")
        print(f"done: {args.steps} steps over 8 chips, {out['recoveries']} recoveries, "
              f"{out['steps_replayed']} steps replayed, {time.perf_counter() - t0:.1f} s in all")
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
