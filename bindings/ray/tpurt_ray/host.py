"""The actor that owns one host of a slice: its chips, through the runtime."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from typing import Any, Callable, Dict, List


@dataclasses.dataclass
class HostContext:
    """What a function run on every host of a slice gets as its first argument."""

    slice_name: str
    worker_id: int
    num_hosts: int
    #: This host's chips as torch devices, ``tpu:0`` onwards (one, for a
    #: slice of one actor per chip).
    devices: List[Any]
    #: Each chip's coordinates in the whole slice.
    coords: List[List[int]]
    #: Each chip's index on its host (``TPU_VISIBLE_CHIPS``).
    host_chips: List[int]
    #: State the host keeps between calls (a model, an optimizer): lost when
    #: the host is replaced, which is what checkpoints are for.
    state: Dict[str, Any]
    #: Chips on each host of the slice.
    chips_per_host: int = 0
    #: This actor's rank among the slice's actors, and their number (hosts,
    #: or chips for a slice of one actor per chip); set by the slice.
    rank: int = 0
    world: int = 1

    @property
    def global_chip_ids(self) -> List[int]:
        """The ranks of this actor's chips in the slice: hosts in worker
        order, chips in their order on the host."""
        per_host = self.chips_per_host or len(self.devices)
        return [self.worker_id * per_host + c for c in self.host_chips]


class SliceHost:
    """One host of a slice. Created by :class:`tpurt_ray.TpuSlice`, one per
    host, each in its own process on its own (emulated or real) TPU VM."""

    def __init__(self, slice_name: str, expect_chips: int, chips_per_host: int):
        import importlib

        import torch

        importlib.import_module("tpurt")  # registers the tpu device
        self._torch = torch
        info = torch.tpu.slice_info()
        if info is None:
            raise RuntimeError(
                "this Ray worker is not on a TPU slice host: none of the TPU_* variables is set "
                f"(node {socket.gethostname()}, pid {os.getpid()})"
            )
        n = torch.tpu.device_count()
        if n != expect_chips:
            raise RuntimeError(
                f"host {info['worker_id']} of slice {slice_name} sees {n} chips but its bundle holds "
                f"{expect_chips} (TPU_VISIBLE_CHIPS={os.environ.get('TPU_VISIBLE_CHIPS')!r})"
            )
        props = [torch.tpu.get_device_properties(i) for i in range(n)]
        self._ctx = HostContext(
            slice_name=info["name"] or slice_name,
            worker_id=int(info["worker_id"]),
            num_hosts=int(info["num_hosts"]),
            devices=[torch.device("tpu", i) for i in range(n)],
            coords=[list(p.coords) for p in props],
            host_chips=[int(p.host_chip) for p in props],
            state={},
            chips_per_host=chips_per_host,
        )
        self._info = info

    def describe(self) -> Dict[str, Any]:
        import ray

        return {
            "worker_id": self._ctx.worker_id,
            "rank_key": (self._ctx.worker_id, min(self._ctx.host_chips) if self._ctx.host_chips else 0),
            "num_hosts": self._ctx.num_hosts,
            "slice_name": self._ctx.slice_name,
            "accelerator_type": self._info["accelerator_type"],
            "topology": list(self._info["topology"]),
            "coords": self._ctx.coords,
            "host_chips": self._ctx.host_chips,
            "visible_chips_env": os.environ.get("TPU_VISIBLE_CHIPS"),
            "platform": self._torch.tpu.platform(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
        }

    def set_rank(self, rank: int, world: int) -> None:
        self._ctx.rank, self._ctx.world = rank, world

    def ping(self) -> int:
        return os.getpid()

    def probe(self) -> List[Dict[str, Any]]:
        """A cheap op through the runtime on each chip: fill, scale, reduce,
        read back; each chip's result is checked."""
        torch = self._torch
        out = []
        for dev, host_chip in zip(self._ctx.devices, self._ctx.host_chips):
            t0 = time.perf_counter()
            try:
                x = torch.arange(1024, dtype=torch.float32, device=dev)
                got = float((x * 2.0).sum().item())
                want = 1023.0 * 1024.0
                ok = got == want
                error = None if ok else f"probe sum {got} != {want}"
            except Exception as e:  # a failing chip is a result, not a crash
                ok, error = False, f"{type(e).__name__}: {e}"
            out.append(
                {
                    "device": str(dev),
                    "host_chip": host_chip,
                    "ok": ok,
                    "error": error,
                    "ms": (time.perf_counter() - t0) * 1e3,
                }
            )
        return out

    def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        return fn(self._ctx, *args, **kwargs)

    def address(self) -> str:
        """This host's address for a rendezvous (the node's IP)."""
        import ray

        return ray.util.get_node_ip_address()

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def init_collectives(self, init_method: str, backend: str, timeout_s: float) -> None:
        """Join the slice's group (rank and world as :meth:`set_rank` gave).
        A group from before a recovery is left first."""
        import datetime

        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=self._ctx.rank,
            world_size=self._ctx.world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )

    def leave_collectives(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def exit(self, code: int = 1) -> None:
        """Leave the process at once (tests: a host that dies mid-run)."""
        os._exit(code)


def remote_host_class():
    """SliceHost as a Ray actor class (Ray is imported only where it is used)."""
    import ray

    return ray.remote(SliceHost)
