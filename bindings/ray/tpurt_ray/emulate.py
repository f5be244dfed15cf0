"""Emulated multi-host TPU slices for a Ray cluster on one machine.

Each host of the slice becomes a Ray node (``ray.cluster_utils.Cluster``)
that Ray takes for a real TPU VM: the node is started with the ``TPU_*``
variables a TPU VM carries, so Ray's own detection gives it the ``TPU``
resource, the slice-name, worker-id, topology and pod-type labels and the
``TPU-<pod type>-head`` resource on worker 0, which is what
``ray.util.tpu.SlicePlacementGroup`` schedules on. The same variables reach
the node's worker processes, where the tpurt runtime (host platform) shows
each process its chips with their coordinates in the slice.

Nothing here contacts a network host: Ray only asks the cloud metadata
server for what these variables leave unset, and they leave nothing unset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import time
from typing import Dict, Iterator, List, Optional

from .topology import SliceShape, slice_shape

log = logging.getLogger("tpurt_ray")

_names = itertools.count()


@contextlib.contextmanager
def _environ(values: Dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclasses.dataclass
class EmulatedSlice:
    name: str
    shape: SliceShape
    #: The Ray nodes, by worker id.
    nodes: List[object]

    def replace_host(self, cluster, worker_id: int, num_cpus: int = 2, env: Optional[Dict[str, str]] = None):
        """Remove host `worker_id`'s node and start a new one in its place
        (the same slice name and worker id), as a replaced TPU VM would be."""
        cluster.remove_node(self.nodes[worker_id], allow_graceful=False)
        self.nodes[worker_id] = _add_host(cluster, self.shape, self.name, worker_id, num_cpus, env)
        return self.nodes[worker_id]


def _add_host(cluster, shape: SliceShape, name: str, worker_id: int, num_cpus: int, env: Optional[Dict[str, str]]):
    host_env = shape.host_env(worker_id, name)
    # The emulated host has exactly the chips of one host of the slice.
    host_env["TPURT_HOST_CHIPS"] = str(shape.chips_per_host)
    host_env.update(env or {})
    # Ray resolves a node's resources and labels in this process, from
    # os.environ; the raylet and its workers get the same variables.
    with _environ(host_env):
        node = cluster.add_node(num_cpus=num_cpus, resources={"TPU": shape.chips_per_host}, env_vars=host_env)
    log.info("emulated TPU host %s/%d started (%s, %d chips)", name, worker_id, shape.pod_type, shape.chips_per_host)
    return node


def add_slice(
    cluster,
    topology: str = "2x2x2",
    accelerator_version: str = "v4",
    *,
    name: Optional[str] = None,
    chips_per_host: Optional[int] = None,
    num_cpus_per_host: int = 2,
    env: Optional[Dict[str, str]] = None,
) -> EmulatedSlice:
    """Add one node per host of an emulated TPU slice to `cluster`
    (a ``ray.cluster_utils.Cluster``). `env` adds variables to every host
    (for example ``TPURT_PLATFORM``)."""
    shape = slice_shape(topology, accelerator_version, chips_per_host)
    name = name or f"tpurt-emulated-{os.getpid()}-{next(_names)}"
    nodes = [_add_host(cluster, shape, name, w, num_cpus_per_host, env) for w in range(shape.num_hosts)]
    cluster.wait_for_nodes()
    return EmulatedSlice(name=name, shape=shape, nodes=nodes)


def kill_host(actor, timeout_s: float = 30.0, call_timeout_s: float = 5.0) -> bool:
    """Kill a slice's host actor (``ray.kill``, no restart) and wait until a
    call to it fails, as a real host failure would be seen. ``ray.kill``
    returns before the actor is gone: a call sent right after it may still
    be answered (a health probe then called the killed host healthy). True
    once a call fails; False if the actor still answers after `timeout_s`."""
    import ray

    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=call_timeout_s)
        except Exception:
            return True
        time.sleep(0.05)
    return False
