"""DistributedDataParallel on tpu over the "tpurt" backend, two processes."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ddp_worker  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("backend", ["tpurt", "cpu:gloo,tpu:tpurt"])
def test_ddp_over_two_processes_matches_full_batch_training(tmp_path, backend):
    world, port = 2, _free_port()
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "ddp_worker.py"), str(r), str(world), str(port), str(outs[r]), backend],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log
    got = [torch.load(o) for o in outs]

    # The same training on the CPU, one process, the whole batch.
    m = ddp_worker.model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(5):
        x, y = ddp_worker.batch(step, world)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    for r in range(world):
        for a, b in zip(got[r]["params"], m.parameters()):
            torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)
        assert [g.tolist() for g in got[r]["gathered"]] == [[0.0, 1.0], [1.0, 1.0]]
    assert torch.equal(got[0]["mean_loss"], got[1]["mean_loss"])
