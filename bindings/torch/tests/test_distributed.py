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


def _run_ranks(script: str, world: int, args, env) -> None:
    """Runs `script` once per rank (args(r), env(r)) and waits for all;
    each must succeed (its output is the failure's message)."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / script), *args(r)],
            env=env(r),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log


@pytest.mark.parametrize("backend", ["tpurt", "cpu:gloo,tpu:tpurt"])
def test_ddp_over_two_processes_matches_full_batch_training(tmp_path, backend):
    world, port = 2, _free_port()
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    _run_ranks("ddp_worker.py", world, lambda r: [str(r), str(world), str(port), str(outs[r]), backend], lambda r: env)
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


def test_topology_aware_mesh_over_four_chips_of_a_slice(tmp_path):
    # Rank r owns chip (3 - r) of a 2x2 slice, so rank order is not chip
    # order: the mesh must follow the chips.
    world, port = 4, _free_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    slice_env = dict(
        TPU_ACCELERATOR_TYPE="v5litepod-4", TPU_TOPOLOGY="2x2", TPU_CHIPS_PER_HOST_BOUNDS="2,2,1",
        TPU_HOST_BOUNDS="1,1,1", TPU_WORKER_ID="0", TPU_SKIP_MDS_QUERY="1",
    )
    _run_ranks(
        "mesh_worker.py",
        world,
        lambda r: [str(r), str(world), str(port), str(outs[r])],
        lambda r: dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", TPU_VISIBLE_CHIPS=str(3 - r), **slice_env),
    )
    import json

    got = [json.loads(o.read_text()) for o in outs]
    chip = {r: tuple(g["coords"]) for r, g in enumerate(got)}
    assert sorted(chip.values()) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    mesh = got[0]["mesh"]
    assert all(g["mesh"] == mesh and g["ring"] == got[0]["ring"] for g in got)
    # Along tp (the last axis) chips differ in x by one, along dp in y.
    for row in mesh:
        assert [chip[r][1] for r in row] == [chip[row[0]][1]] * 2 and {chip[r][0] for r in row} == {0, 1}
    assert {chip[mesh[0][0]][1], chip[mesh[1][0]][1]} == {0, 1}
    # The ring of four visits each chip once, each step to a neighbour.
    ring = got[0]["ring"]
    steps = [sum(abs(a - b) for a, b in zip(chip[p], chip[q])) for p, q in zip(ring, ring[1:])]
    assert sorted(ring) == [0, 1, 2, 3] and steps == [1, 1, 1]
    # Each rank's sums over its mesh axes are over the right ranks.
    for r, g in enumerate(got):
        row = next(row for row in mesh if r in row)
        col = [row_[row.index(r)] for row_ in mesh]
        assert g["sums"] == {"tp": float(sum(row)), "dp": float(sum(col))}
        assert sorted(v for (v,) in g["tp_gathered"]) == sorted(float(q) for q in row)
    # torch.tpu.ops.all_gather_dim / reduce_scatter_dim and their gradients.
    base = torch.arange(6.0).reshape(2, 3)
    w = torch.arange(float(2 * 3 * world)).reshape(2, 3 * world)
    y = torch.arange(float(2 * 2 * world)).reshape(2, 2 * world)
    for r, g in enumerate(got):
        assert g["gathered"] == torch.cat([base + 100 * q for q in range(world)], 1).tolist()
        assert g["x_grad"] == (world * w[:, 3 * r : 3 * r + 3]).tolist()
        assert g["scattered"] == (sum(range(1, world + 1)) * y[:, 2 * r : 2 * r + 2]).tolist()
        assert g["y_grad"] == torch.cat([torch.full((2, 2), float(q + 1)) for q in range(world)], 1).tolist()


def test_mesh_layout_follows_the_torus():
    from tpurt.distributed import _mesh_ranks

    def dist_(a, b):
        return sum(abs(x - y) for x, y in zip(a, b))

    grid = [(x, y) for y in range(4) for x in range(4)]  # rank r is chip (r % 4, r // 4)
    for shape in [(16,), (4, 4), (2, 8), (1, 16), (2, 2, 4)]:
        ranks = torch.tensor(_mesh_ranks(grid, shape)).reshape(shape)
        assert sorted(ranks.flatten().tolist()) == list(range(16))
        last = ranks.reshape(-1, shape[-1])
        for row in last.tolist():  # the last axis: neighbours on the interconnect
            assert all(dist_(grid[p], grid[q]) == 1 for p, q in zip(row, row[1:])), (shape, row)
    # 3-D slices and ranks in any order: the layout follows the chips.
    cube = [(x, y, z) for z in range(2) for y in range(2) for x in range(2)]
    shuffled = cube[::-1]
    ranks = _mesh_ranks(shuffled, (8,))
    assert all(dist_(shuffled[p], shuffled[q]) == 1 for p, q in zip(ranks, ranks[1:]))
    # A shape that does not split the box: its snake order, cut.
    assert sorted(_mesh_ranks(grid[:12], (3, 4))) == list(range(12))
    with pytest.raises(ValueError, match="do not fill a box"):
        _mesh_ranks([(0, 0), (1, 1)], (2,))
    with pytest.raises(ValueError, match="do not fill a box"):
        _mesh_ranks([(0, 0), (0, 0)], (2,))


def test_topology_aware_mesh_needs_torch_distributed():
    import torch.distributed as dist

    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            torch.tpu.topology_aware_mesh((1,))
