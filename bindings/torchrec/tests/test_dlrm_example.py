"""examples/dlrm_train.py: the DLRM on tpu (SparseCore tables, fused
Adagrad) learns the synthetic clicks: its training loss falls and its
held-out log loss beats a constant predictor's."""

import importlib.util
import pathlib
import sys

import torch

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "dlrm_train.py"


def _example():
    spec = importlib.util.spec_from_file_location("dlrm_train", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dlrm_train"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_dlrm_loss_goes_down_on_tpu():
    d = _example()
    cfg = d.Config(batch=64, batches=120, tables=(500, 300, 200, 100), lr=0.1)
    losses, held_out, _, tr = d.train(120, cfg)
    assert tr.device.type == "tpu"
    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    teacher, const = d.teacher_logloss(d.ClickData(cfg))
    assert last < first - 0.05, (first, last)
    assert held_out < const - 0.03, (held_out, const, teacher)
    # The tables were trained on the device: rows looked up moved.
    tables = tr.unstacked_tables()
    assert set(tables) == {"t0", "t1", "t2", "t3"}
    assert all(torch.isfinite(t).all() for t in tables.values())
