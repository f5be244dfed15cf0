"""Ray binding benchmarks (bindings/ray), each against its peer in the same
run, on an emulated 2-host x 4-chip v4 slice in a Ray cluster on this
machine: one JSON object per line (name, ours, peer, peer_name, unit,
ratio = peer / ours; above 1 means ours is faster).

    .venv/bin/python bench/ray_bench.py [NAME...] [--list]

- ray_slice_startup: forming a TpuSlice (reservation, one actor per host,
  each opening the runtime and checking its chips) against Ray's own
  ray.util.tpu.SlicePlacementGroup and run_on_slice of an empty function
  (reservation and one task per host, no runtime).
- ray_recover_killed_host: from a killed host process to a re-formed slice
  with collectives (TpuSlice.recover, policy "host") against forming the
  whole slice again from nothing.
- ray_dp_step_8_chips: time per training sample of a data-parallel step
  (an MLP, tpurt_ray.dp: one actor per host, a replica per chip,
  gradients averaged over the slice) over all 8 chips against one chip of
  one host; the ratio is the scaling factor (ideal 8; these emulated chips
  share this machine's CPU cores).
- ray_ddp_step_8_chips: the same with DistributedDataParallel, one actor
  per chip over the "tpurt" backend, against one chip without DDP.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import ray  # noqa: E402
import ray.cloudpickle  # noqa: E402
import rows  # noqa: E402
from rows import chosen  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


# Seconds and microseconds here: four decimals.
row = functools.partial(rows.row, digits=4)


def slice_startup(rounds: int = 3) -> None:
    from ray.util.tpu import SlicePlacementGroup, run_on_slice

    from tpurt_ray import TpuSlice

    @ray.remote
    def nothing():
        return os.getpid()

    ours, peer = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        s = TpuSlice("2x2x2", "v4")
        ours.append(time.perf_counter() - t0)
        s.shutdown()
        t0 = time.perf_counter()
        # Ray's run_on_slice keeps a slice it reserved itself; reserve it
        # here so that it can be released after.
        handle = SlicePlacementGroup(topology="2x2x2", accelerator_version="v4")
        ray.get(run_on_slice(nothing, tpu_slice=handle))
        peer.append(time.perf_counter() - t0)
        handle.shutdown()
    row("ray_slice_startup", statistics.median(ours), statistics.median(peer),
        "ray.util.tpu SlicePlacementGroup + run_on_slice (no runtime)", "s")


def recover_killed_host(rounds: int = 3) -> None:
    from tpurt_ray import TpuSlice
    from tpurt_ray.emulate import kill_host

    ours, peer = [], []
    with TpuSlice("2x2x2", "v4") as s:
        s.init_collectives()
        for _ in range(rounds):
            # Wait until the kill is seen, as a real failure would be:
            # otherwise recover() could see every host alive and find the
            # dead one only when it calls it.
            kill_host(s._hosts[1], timeout_s=10.0, call_timeout_s=1.0)
            s.recover("host")
            ours.append(s.last_recovery_s)
    for _ in range(rounds):
        t0 = time.perf_counter()
        with TpuSlice("2x2x2", "v4") as s:
            s.init_collectives()
            peer.append(time.perf_counter() - t0)
    row("ray_recover_killed_host", statistics.median(ours), statistics.median(peer),
        "forming the slice again (TpuSlice + collectives)", "s")


def _dp_setup(ctx, checkpoint, chips, cross_host=True):
    import torch

    from tpurt_ray.dp import SliceDataParallel

    ctx.devices = ctx.devices[:chips]

    def make_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))

    ctx.state["dp"] = SliceDataParallel(
        ctx, make_model, lambda p: torch.optim.SGD(p, lr=1e-3), checkpoint, cross_host=cross_host
    )


def _dp_steps(ctx, n, batch):
    import time

    import torch

    dp = ctx.state["dp"]
    x = {str(d): torch.randn(batch, 256, device=d) for d in dp.ctx.devices}

    def loss_fn(model, rank):
        dev = next(model.parameters()).device
        return (model(x[str(dev)]) ** 2).mean()

    dp.step(loss_fn)  # warm-up
    t0 = time.perf_counter()
    for _ in range(n):
        dp.step(loss_fn)
    return time.perf_counter() - t0


def _dp_one_chip(ctx, steps, batch):
    """The same step on one chip of this host, outside the host group."""
    import dataclasses

    one = dataclasses.replace(ctx, worker_id=0, num_hosts=1, state={})
    _dp_setup(one, None, 1, cross_host=False)
    return _dp_steps(one, steps, batch)


def dp_step(steps: int = 10, batch: int = 256) -> None:
    from tpurt_ray import TpuSlice

    with TpuSlice("2x2x2", "v4") as s:
        s.init_collectives()
        s.run(_dp_setup, None, 4)
        t8 = max(s.run(_dp_steps, steps, batch))
        t1 = ray.get(s._hosts[0].run.remote(_dp_one_chip, (steps, batch), {}))
    per_sample_8 = t8 / (steps * batch * 8)
    per_sample_1 = t1 / (steps * batch)
    row("ray_dp_step_8_chips", per_sample_8 * 1e6, per_sample_1 * 1e6,
        "one chip (same step, same per-chip batch)", "us/sample")


def _mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))


def _train_steps(ctx, n, batch, ddp):
    import time

    import torch

    dev = ctx.devices[0]
    model = _mlp().to(dev)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 256, device=dev)

    def one():
        opt.zero_grad()
        (model(x) ** 2).mean().backward()
        opt.step()

    one()  # warm-up
    torch.tpu.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        one()
    torch.tpu.synchronize()
    return time.perf_counter() - t0


def ddp_step(steps: int = 10, batch: int = 256) -> None:
    from tpurt_ray import TpuSlice

    with TpuSlice("2x2x2", "v4", per_chip=True) as s:
        s.init_collectives()
        t8 = max(s.run(_train_steps, steps, batch, True))
        t1 = ray.get(s._hosts[0].run.remote(_train_steps, (steps, batch, False), {}))
    row("ray_ddp_step_8_chips", t8 / (steps * batch * 8) * 1e6, t1 / (steps * batch) * 1e6,
        "one chip, no DDP (same step, same per-chip batch)", "us/sample")


BENCHES = {
    "ray_slice_startup": slice_startup,
    "ray_recover_killed_host": recover_killed_host,
    "ray_dp_step_8_chips": dp_step,
    "ray_ddp_step_8_chips": ddp_step,
}


def main() -> None:
    names = chosen(BENCHES, sys.argv[1:])
    if names is None:
        return
    from tpurt_ray.emulate import add_slice

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        add_slice(cluster, "2x2x2", "v4")
        for name in names:
            BENCHES[name]()
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
