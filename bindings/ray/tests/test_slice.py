"""Slices on an emulated two-host cluster: placement, isolation, run, health."""

import itertools
import sys

import pytest
import ray
import ray.cloudpickle

from tpurt_ray import HostFailed, SliceError, TpuSlice
from tpurt_ray.emulate import add_slice, kill_host

# Functions run on the slice travel by value (workers cannot import tests).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def emulated(cluster):
    # One v4 slice of 2x2x2 chips: two hosts of four.
    return add_slice(cluster, "2x2x2", "v4", name="slice-a")


def test_ray_sees_the_emulated_hosts_as_tpu_vms(emulated):
    tpu_nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("TPU")]
    labels = sorted((n["Labels"]["ray.io/tpu-worker-id"], n["Labels"]["ray.io/tpu-slice-name"]) for n in tpu_nodes)
    assert labels == [("0", "slice-a"), ("1", "slice-a")]
    for n in tpu_nodes:
        assert n["Labels"]["ray.io/tpu-pod-type"] == "v4-16"
        assert n["Labels"]["ray.io/tpu-topology"] == "2x2x2"
        assert n["Resources"]["TPU"] == 4
    heads = [n for n in tpu_nodes if n["Resources"].get("TPU-v4-16-head")]
    assert [n["Labels"]["ray.io/tpu-worker-id"] for n in heads] == ["0"]


def test_a_slice_places_one_actor_per_host_with_its_chips(emulated):
    with TpuSlice("2x2x2", "v4", ready_timeout_s=60) as s:
        assert s.name == "slice-a" and s.num_hosts == 2
        infos = s.host_info
        assert [i["worker_id"] for i in infos] == [0, 1]
        assert len({i["node_id"] for i in infos}) == 2, "each host actor on its own node"
        coords = [tuple(c) for i in infos for c in i["coords"]]
        assert sorted(coords) == sorted(itertools.product(range(2), range(2), range(2)))
        for i in infos:
            # The runtime's coordinates (Rust, from the TPU_* variables)
            # agree with the slice shape's (Python, from Ray's tables).
            assert i["coords"] == i["slice_coords"]
            assert i["host_chips"] == [0, 1, 2, 3]
            assert i["topology"] == [2, 2, 2] and i["accelerator_type"] == "v4-16"
            assert {tuple(c)[2] for c in i["coords"]} == {i["worker_id"]}, "a host is one z-plane"


def _sum_on_each_chip(ctx, scale):
    import torch

    out = []
    for dev, rank in zip(ctx.devices, ctx.global_chip_ids):
        x = torch.full((256,), float(rank), device=dev) * scale
        out.append((rank, str(dev), float(x.sum().item())))
    return ctx.worker_id, out


def test_run_calls_every_host_and_returns_in_worker_order(emulated):
    with TpuSlice("2x2x2", "v4") as s:
        results = s.run(_sum_on_each_chip, 3.0)
    assert [w for w, _ in results] == [0, 1]
    flat = [r for _, out in results for r in out]
    assert [r[0] for r in flat] == list(range(8))
    assert all(total == 256 * 3.0 * rank for rank, _, total in flat)


def test_health_probes_every_chip_and_names_a_dead_host(emulated):
    with TpuSlice("2x2x2", "v4") as s:
        h = s.health()
        assert h.healthy, h
        assert [len(x.chips) for x in h.hosts] == [4, 4]
        assert all(c["ok"] and c["ms"] >= 0 for x in h.hosts for c in x.chips)
        assert kill_host(s._hosts[1]), "host 1 still answers after ray.kill"
        h = s.health(timeout_s=20)
        assert not h.healthy and h.failed() == [1]
        assert not h.hosts[1].alive and "Actor" in h.hosts[1].error
        with pytest.raises(HostFailed, match="host 1 of the slice failed"):
            s.run(_sum_on_each_chip, 1.0)


@ray.remote(num_cpus=0, resources={"TPU": 2})
class _TwoChips:
    def look(self):
        import os

        import torch

        import importlib

        importlib.import_module("tpurt")
        info = torch.tpu.slice_info()
        props = [torch.tpu.get_device_properties(i) for i in range(torch.tpu.device_count())]
        return {
            "visible": os.environ["TPU_VISIBLE_CHIPS"],
            "node": ray.get_runtime_context().get_node_id(),
            "host_chips": [p.host_chip for p in props],
            "coords": [list(p.coords) for p in props],
            "topology": info["topology"],
        }


def test_part_of_a_host_sees_exactly_its_chips(emulated):
    # Four 2-chip actors on two 4-chip hosts, alive at once: Ray hands out
    # disjoint chips, and the runtime in each process shows only those.
    actors = [_TwoChips.remote() for _ in range(4)]
    try:
        got = ray.get([a.look.remote() for a in actors], timeout=120)
    finally:
        for a in actors:
            ray.kill(a)
    by_node = {}
    for g in got:
        assert g["host_chips"] == [int(c) for c in g["visible"].split(",")]
        assert g["topology"] == [1, 2], "a 2-chip part of a host is a 1x2 slice of its own"
        by_node.setdefault(g["node"], []).extend(g["host_chips"])
    assert len(by_node) == 2
    assert all(sorted(chips) == [0, 1, 2, 3] for chips in by_node.values()), by_node


def test_a_slice_nobody_has_is_a_clear_error(emulated):
    with pytest.raises(SliceError, match="v4-32"):
        TpuSlice("2x2x4", "v4", ready_timeout_s=3)


def test_one_actor_per_chip_knows_its_place_in_the_slice(emulated):
    with TpuSlice("2x2x2", "v4", per_chip=True) as s:
        infos = s.host_info
    assert len(infos) == 8
    assert all(i["coords"] == [[0, 0]] for i in infos), "each sees itself as a 1-chip slice"
    coords = sorted(tuple(i["slice_coords"][0]) for i in infos)
    assert coords == sorted(itertools.product(range(2), range(2), range(2)))


def test_a_slice_on_the_xla_platform(cluster):
    # The same slice with the runtime on XLA (the XLA CPU plugin standing in
    # for each host's chips): the TPU_* variables hold there too.
    add_slice(cluster, "2x4", "v5litepod", name="slice-x", chips_per_host=4, env={"TPURT_PLATFORM": "xla"})
    with TpuSlice("2x4", "v5litepod", chips_per_host=4) as s:
        assert s.name == "slice-x"
        infos = s.host_info
        assert [i["platform"] for i in infos] == ["xla", "xla"]
        assert all(i["coords"] == i["slice_coords"] for i in infos)
        assert sorted(tuple(c) for i in infos for c in i["coords"]) == sorted(
            itertools.product(range(2), range(4))
        )
        assert s.health().healthy
