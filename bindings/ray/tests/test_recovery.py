"""Recovery: a host dies in the middle of data-parallel training over all
eight chips of an emulated 2-host slice, and the run ends with the same
parameters as one that was not interrupted."""

import functools
import os
import sys

import pytest
import ray
import ray.cloudpickle
import torch

from tpurt_ray import TpuSlice
from tpurt_ray.emulate import add_slice

# The functions below travel to the host actors by value (the workers
# cannot import this test module).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS = 6


@pytest.fixture(scope="module")
def emulated(cluster):
    return add_slice(cluster, "2x2x2", "v4", name="slice-r")


def _setup(ctx, checkpoint):
    import torch

    from tpurt_ray.dp import SliceDataParallel

    def make_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    ctx.state["dp"] = SliceDataParallel(ctx, make_model, lambda p: torch.optim.AdamW(p, lr=1e-2), checkpoint)


def _step(ctx, i, die=None):
    import os

    import torch

    if die is not None:
        worker, at, marker = die
        if ctx.worker_id == worker and i == at and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # the host's process dies in the middle of the step

    def loss_fn(model, rank):
        g = torch.Generator().manual_seed(1000 * i + rank)
        x = torch.randn(32, 8, generator=g)
        y = torch.sin(x.sum(1, keepdim=True))
        dev = next(model.parameters()).device
        return torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev))

    dp = ctx.state["dp"]
    loss = dp.step(loss_fn)
    assert dp.replicas_equal(), "replicas drifted apart"
    return loss


def _save(ctx):
    return ctx.state["dp"].state_dict()


def _train(s, **kw):
    return s.train(_setup, kw.pop("step", _step), _save, steps=STEPS, **kw)


@pytest.fixture(scope="module")
def reference(emulated):
    with TpuSlice("2x2x2", "v4") as s:
        out = _train(s, checkpoint_every=2)
    assert out["recoveries"] == 0
    return out


def _assert_same_parameters(a, b):
    ma, mb = a["checkpoint"]["state"]["model"], b["checkpoint"]["state"]["model"]
    assert ma.keys() == mb.keys()
    for k in ma:
        assert torch.equal(ma[k], mb[k]), k


def test_the_reference_run_trains(reference):
    assert reference["checkpoint"]["step"] == STEPS
    assert all(isinstance(x, float) for x in reference["results"])
    assert reference["results"][0] == reference["results"][1], "both hosts see the slice-wide loss"


def test_a_killed_host_process_is_restarted_and_training_resumes(emulated, reference, tmp_path):
    die = (1, 3, str(tmp_path / "died"))
    with TpuSlice("2x2x2", "v4") as s:
        node_before = s.host_info[1]["node_id"]
        out = _train(s, step=functools.partial(_step, die=die), checkpoint_every=2, policy="host")
        events = [e["event"] for e in s.events]
        assert s.host_info[1]["node_id"] == node_before, "the host came back on its own node"
        assert s.last_recovery_s > 0
    assert os.path.exists(die[2]), "the host did die"
    assert out["recoveries"] == 1
    # Step 2 was checkpointed; step 3 was in flight: steps 2 and 3 ran again.
    assert out["steps_replayed"] == 2
    assert events.count("host failed") == 1 and "recovered" in events and "resuming" in events
    _assert_same_parameters(out, reference)


def test_a_lost_node_is_replaced_and_the_whole_slice_restarts(emulated, reference, cluster):
    replaced = []

    def on_step(i, results):
        if i == 4 and not replaced:
            replaced.append(emulated.replace_host(cluster, 0))

    with TpuSlice("2x2x2", "v4") as s:
        old = s.host_info[0]["node_id"]
        out = _train(s, checkpoint_every=3, policy="slice", on_step=on_step)
        assert s.host_info[0]["node_id"] != old, "host 0 now runs on the replacement node"
    assert out["recoveries"] == 1
    _assert_same_parameters(out, reference)


def test_a_new_driver_resumes_from_the_checkpoint_directory(emulated, reference, tmp_path):
    # The first driver stops after 3 steps (as if it died); a second one,
    # on a fresh slice, finds the checkpoint and finishes the run.
    d = str(tmp_path / "ckpt")
    with TpuSlice("2x2x2", "v4") as s:
        first = s.train(_setup, _step, _save, steps=3, checkpoint_every=3, checkpoint_dir=d)
    assert first["checkpoint"]["step"] == 3
    with TpuSlice("2x2x2", "v4") as s:
        out = _train(s, checkpoint_every=2, checkpoint_dir=d)
        assert [e["step"] for e in s.events if e["event"] == "resumed from disk"] == [3]
    assert out["checkpoint"]["step"] == STEPS
    _assert_same_parameters(out, reference)
