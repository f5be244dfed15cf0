"""One rank of the topology-aware mesh test (test_distributed.py): one chip
of a 2x2 slice (TPU_VISIBLE_CHIPS picks it), builds meshes and sums over
their axes, and runs torch.tpu.ops' collectives along a dimension.
Arguments: rank world port out_path"""

import json
import sys

import torch
import torch.distributed as dist

import tpurt  # noqa: F401  (registers tpu and the tpurt backend)


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("tpurt", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = torch.tpu.topology_aware_mesh((2, 2), ("dp", "tp"))
    ring = torch.tpu.topology_aware_mesh((world,))
    # A sum over each axis of the 2x2 mesh, through its groups.
    sums = {}
    for name in ("dp", "tp"):
        t = torch.tensor([float(rank)], device="tpu")
        dist.all_reduce(t, group=mesh.get_group(name))
        sums[name] = t.item()
    # torch.tpu.ops' collectives along a dimension, and their gradients.
    x = (torch.arange(6.0).reshape(2, 3) + 100 * rank).to("tpu").requires_grad_()
    gathered = torch.tpu.ops.all_gather_dim(x, 1)
    w = torch.arange(float(2 * 3 * world)).reshape(2, 3 * world).to("tpu")
    (gathered * w).sum().backward()
    y = (torch.arange(float(2 * 2 * world)).reshape(2, 2 * world) * (rank + 1)).to("tpu").requires_grad_()
    scattered = torch.tpu.ops.reduce_scatter_dim(y, -1)
    (scattered * (rank + 1)).sum().backward()
    tp = torch.tpu.ops.all_gather_dim(torch.tensor([[float(rank)]], device="tpu"), 0, group=mesh.get_group("tp"))
    result = {
        "coords": list(torch.tpu.get_device_properties(0).coords),
        "mesh": mesh.mesh.tolist(),
        "ring": ring.mesh.tolist(),
        "sums": sums,
        "gathered": gathered.tolist(),
        "x_grad": x.grad.tolist(),
        "scattered": scattered.tolist(),
        "y_grad": y.grad.tolist(),
        "tp_gathered": tp.tolist(),
    }
    dist.barrier()
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
