"""One rank of the DDP test (test_distributed.py): trains a small model
with DistributedDataParallel on tpu over the "tpurt" backend and saves its
final parameters. Arguments: rank world port out_path backend"""

import sys

import torch
import torch.distributed as dist

import tpurt  # noqa: F401  (registers tpu and the tpurt backend)

assert tpurt.distributed.BACKEND == "tpurt"


def batch(step: int, world: int):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(8 * world, 12, generator=g)
    y = torch.sin(x.sum(1, keepdim=True))
    return x, y


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def main() -> None:
    rank, world, port, out, backend = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    m = model()
    # Rank 1 starts from other weights: DDP's first broadcast must fix that.
    if rank != 0:
        with torch.no_grad():
            for p in m.parameters():
                p.add_(1.0)
    ddp = torch.nn.parallel.DistributedDataParallel(m.to("tpu"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(5):
        x, y = batch(step, world)
        xs, ys = x[rank::world].to("tpu"), y[rank::world].to("tpu")
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(xs), ys)
        loss.backward()
        opt.step()
    # A collective outside DDP too: the mean of the ranks' losses.
    t = loss.detach().clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    gathered = [torch.zeros(2, device="tpu") for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([float(rank), 1.0], device="tpu"))
    dist.barrier()
    torch.save(
        {
            "params": [p.detach().cpu() for p in ddp.module.parameters()],
            "mean_loss": t.cpu(),
            "gathered": [g.cpu() for g in gathered],
        },
        out,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
