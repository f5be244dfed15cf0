"""DistributedDataParallel over every chip of an emulated 2-host x 4-chip
slice: one actor per chip, the "tpurt" torch.distributed backend."""

import sys

import pytest
import ray
import ray.cloudpickle
import torch

from tpurt_ray import TpuSlice
from tpurt_ray.emulate import add_slice

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS = 4


@pytest.fixture(scope="module")
def emulated(cluster):
    return add_slice(cluster, "2x2x2", "v4", name="slice-d")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _batch(step, world):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(2 * world, 6, generator=g)
    return x, torch.cos(x.sum(1, keepdim=True))


def _ddp_train(ctx, steps):
    import torch
    import torch.distributed as dist

    assert dist.get_world_size() == ctx.world and dist.get_rank() == ctx.rank
    ddp = torch.nn.parallel.DistributedDataParallel(_model().to(ctx.devices[0]))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2)
    for step in range(steps):
        x, y = _batch(step, ctx.world)
        xs, ys = x[ctx.rank :: ctx.world].to(ctx.devices[0]), y[ctx.rank :: ctx.world].to(ctx.devices[0])
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(xs), ys).backward()
        opt.step()
    return {
        "rank": ctx.rank,
        "chip": ctx.global_chip_ids,
        "params": [p.detach().cpu() for p in ddp.module.parameters()],
    }


def test_ddp_trains_over_all_eight_chips_like_one_full_batch(emulated):
    with TpuSlice("2x2x2", "v4", per_chip=True) as s:
        assert s.world == 8
        assert [(i["worker_id"], i["host_chips"]) for i in s.host_info] == [
            (w, [c]) for w in range(2) for c in range(4)
        ]
        s.init_collectives()
        out = s.run(_ddp_train, STEPS)
    assert [o["rank"] for o in out] == list(range(8))
    assert [o["chip"] for o in out] == [[r] for r in range(8)]
    ref = _model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    for step in range(STEPS):
        x, y = _batch(step, 8)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
    for o in out:
        for a, b in zip(o["params"], ref.parameters()):
            torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)
