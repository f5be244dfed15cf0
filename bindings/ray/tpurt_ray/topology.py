"""How a TPU slice splits into hosts, and the environment of each host.

Ray's own tables decide the shape (`ray.util.tpu`: chips per host, pod
type); this module only turns them into the ``TPU_*`` variables a TPU VM
carries, which the tpurt runtime reads on every platform
(runtime/src/platform/slice.rs).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

from ray._private.accelerators.tpu import (
    get_chips_per_host,
    get_num_chips_from_topology,
    infer_tpu_pod_type_from_topology,
)


def _dims(topology: str) -> Tuple[int, int, int]:
    try:
        dims = [int(d) for d in topology.strip().lower().split("x")]
    except ValueError:
        dims = []
    if not 1 <= len(dims) <= 3 or any(d <= 0 for d in dims):
        raise ValueError(f"topology {topology!r} is not of the form AxB or AxBxC with positive whole numbers")
    return tuple(dims + [1] * (3 - len(dims)))  # type: ignore[return-value]


def _host_block(chips: int) -> Tuple[int, int, int]:
    """The x, y, z extent of a host of `chips` chips, as TPU hosts are built."""
    blocks = {1: (1, 1, 1), 2: (1, 2, 1), 4: (2, 2, 1), 8: (2, 4, 1)}
    if chips not in blocks:
        raise ValueError(f"a TPU host has 1, 2, 4 or 8 chips, not {chips}")
    return blocks[chips]


@dataclasses.dataclass(frozen=True)
class SliceShape:
    """A slice of `topology` chips of one TPU generation, split into hosts."""

    topology: str
    accelerator_version: str
    pod_type: str
    chips: int
    chips_per_host: int
    chips_per_host_bounds: Tuple[int, int, int]
    host_bounds: Tuple[int, int, int]

    @property
    def num_hosts(self) -> int:
        return self.host_bounds[0] * self.host_bounds[1] * self.host_bounds[2]

    def chip_coords(self, worker_id: int, host_chip: int) -> List[int]:
        """Coordinates in the slice of chip `host_chip` of host `worker_id`
        (hosts and chips each counted x fastest, as TPU runtimes count and
        as the tpurt runtime reports them)."""

        def mesh(i: int, dims) -> List[int]:
            out = []
            for d in dims:
                out.append(i % d)
                i //= d
            return out

        h = mesh(worker_id, self.host_bounds)
        c = mesh(host_chip, self.chips_per_host_bounds)
        xyz = [h[k] * self.chips_per_host_bounds[k] + c[k] for k in range(3)]
        return xyz[: len(self.topology.split("x"))]

    def host_env(self, worker_id: int, name: str) -> Dict[str, str]:
        """The ``TPU_*`` variables of host `worker_id` of the slice `name`."""
        if not 0 <= worker_id < self.num_hosts:
            raise ValueError(f"worker_id {worker_id}: the slice has {self.num_hosts} hosts")
        return {
            "TPU_NAME": name,
            "TPU_WORKER_ID": str(worker_id),
            "TPU_ACCELERATOR_TYPE": self.pod_type,
            "TPU_TOPOLOGY": self.topology,
            "TPU_CHIPS_PER_HOST_BOUNDS": ",".join(map(str, self.chips_per_host_bounds)),
            "TPU_HOST_BOUNDS": ",".join(map(str, self.host_bounds)),
        }


def slice_shape(topology: str, accelerator_version: str, chips_per_host: Optional[int] = None) -> SliceShape:
    """Split a slice into hosts as Ray's ``SlicePlacementGroup`` does.

    ``chips_per_host`` overrides Ray's default (as its ``chips_per_vm``)."""
    topology = topology.strip().lower()
    version = accelerator_version.strip().lower().replace("tpu-", "")
    dims = _dims(topology)
    chips = get_num_chips_from_topology(topology)
    per_host = chips_per_host if chips_per_host is not None else get_chips_per_host(topology, version)
    per_host = min(per_host, chips)
    block = _host_block(per_host)
    if any(d % b for d, b in zip(dims, block)):
        raise ValueError(
            f"topology {topology} does not split into hosts of {per_host} chips "
            f"({'x'.join(map(str, block[:len(topology.split('x'))]))} each)"
        )
    hosts = tuple(d // b for d, b in zip(dims, block))
    return SliceShape(
        topology=topology,
        accelerator_version=version,
        pod_type=infer_tpu_pod_type_from_topology(topology, version),
        chips=chips,
        chips_per_host=per_host,
        chips_per_host_bounds=block,
        host_bounds=hosts,  # type: ignore[arg-type]
    )


def env_for_hosts(shape: SliceShape, name: str) -> List[Dict[str, str]]:
    return [shape.host_env(w, name) for w in range(shape.num_hosts)]
