"""A small DLRM (TorchRec's) trained on synthetic click data on tpu, its
embedding tables on the SparseCores.

    .venv/bin/python examples/dlrm_train.py [--steps 300] [--batch 256]

The embeddings are TorchRec's SparseCoreFusedEmbeddingBagCollection: the
input pipeline preprocesses each KeyedJaggedTensor into tpurt's CSR layout
on the CPU (TorchRec's SparseCoreInputPreprocessor with tpurt_torchrec's
backend), the lookups run on the device's SparseCore queue, and Adagrad is
fused into their backward. The dense arch, interaction and over arch are
TorchRec's DLRM modules on tpu, trained with Adagrad. With --peer the same
model runs on the CPU with TorchRec's fbgemm tables
(FusedEmbeddingBagCollection) instead, which is what bench/run's
torchrec_dlrm_step row compares.

The clicks come from a hidden "teacher" model (a score per table row and a
linear function of the dense features), so there is something to learn;
the run ends with the held-out log loss against the teacher's own (the
best any model can do) and a constant predictor's.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Tuple

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import torch  # noqa: E402

import tpurt  # noqa: E402,F401  (the tpu device)
import tpurt_torchrec  # noqa: E402,F401  (TorchRec's SparseCore path on tpu)
from torchrec.experimental.torch_tpu.datasets.input_preprocessing import (  # noqa: E402
    SparseCoreInputPreprocessor,
)
from torchrec.experimental.torch_tpu.modules import SparseCoreFusedEmbeddingBagCollection  # noqa: E402
from torchrec.experimental.torch_tpu.modules.embedding_configs import SparseCoreEmbeddingConfig  # noqa: E402
from torchrec.models.dlrm import DLRM  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType  # noqa: E402
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402

DENSE = 13


@dataclass
class Config:
    tables: Tuple[int, ...] = (4000, 2000, 1000, 1000, 500, 500, 200, 100)
    dim: int = 16
    max_ids: int = 4  # ids per bag: 1..max_ids
    batch: int = 256
    batches: int = 32  # distinct training batches (cycled if the run is longer)
    lr: float = 0.05
    seed: int = 0


class ClickData:
    """Synthetic clicks: skewed ids (a few rows are hot), and labels drawn
    from a teacher's click probability."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)
        self.scores = [torch.randn(rows, generator=g) * 0.8 for rows in cfg.tables]
        self.dense_w = torch.randn(DENSE, generator=g) * 0.3
        self.keys = [f"f{i}" for i in range(len(cfg.tables))]
        self.train = [self._batch(g) for _ in range(cfg.batches)]
        self.held_out = [self._batch(g) for _ in range(4)]

    def _batch(self, g: torch.Generator):
        cfg = self.cfg
        b = cfg.batch
        lengths = torch.randint(1, cfg.max_ids + 1, (len(cfg.tables), b), generator=g)
        values, logit = [], torch.zeros(b)
        for t, rows in enumerate(cfg.tables):
            n = int(lengths[t].sum())
            ids = (torch.rand(n, generator=g) ** 3 * rows).long().clamp(max=rows - 1)
            values.append(ids)
            bag = torch.repeat_interleave(torch.arange(b), lengths[t])
            logit.index_add_(0, bag, self.scores[t][ids] / lengths[t][bag])
        dense = torch.randn(b, DENSE, generator=g)
        logit = logit + dense @ self.dense_w
        prob = torch.sigmoid(logit)
        labels = torch.bernoulli(prob, generator=g)
        kjt = KeyedJaggedTensor(keys=self.keys, values=torch.cat(values), lengths=lengths.reshape(-1))
        return dense, kjt, labels, prob


def _table_configs(cfg: Config) -> List[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=cfg.dim, num_embeddings=rows, feature_names=[f"f{i}"],
            pooling=PoolingType.MEAN,
        )
        for i, rows in enumerate(cfg.tables)
    ]


def _logloss(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float(torch.nn.functional.binary_cross_entropy_with_logits(logits, labels))


class Trainer:
    """The DLRM on tpu (SparseCore embeddings) or, with peer=True, on the
    CPU with fbgemm's fused tables."""

    def __init__(self, cfg: Config, data: ClickData, peer: bool = False) -> None:
        self.cfg, self.data, self.peer = cfg, data, peer
        torch.manual_seed(cfg.seed)
        tables = _table_configs(cfg)
        if peer:
            self.device = torch.device("cpu")
            ebc = FusedEmbeddingBagCollection(
                tables=tables, optimizer_type=torch.optim.Adagrad,
                optimizer_kwargs={"lr": cfg.lr, "eps": 1e-8}, device=self.device,
            )
        else:
            self.device = torch.device("tpu")
            nsc = max(1, torch.tpu.get_device_properties(self.device).sparse_cores)
            # Capacity for every id of a batch in one stack: nothing dropped.
            cap = cfg.batch * cfg.max_ids * len(tables)
            sc = [
                SparseCoreEmbeddingConfig(config=t, max_ids_per_partition=cap, max_unique_ids_per_partition=cap)
                for t in tables
            ]
            # Tables stacked (TorchRec's auto_stack): one lookup and one
            # fused update per stack rather than per table.
            ebc = SparseCoreFusedEmbeddingBagCollection(
                sc, torch.optim.Adagrad, {"lr": cfg.lr, "eps": 1e-8}, batch_size=cfg.batch,
                num_sc_per_device=nsc, auto_stack=True,
            )
            self.pre = SparseCoreInputPreprocessor(sc, batch_size=cfg.batch, num_sc_per_device=nsc, auto_stack=True)
        self.model = DLRM(
            embedding_bag_collection=ebc, dense_in_features=DENSE,
            dense_arch_layer_sizes=[64, cfg.dim], over_arch_layer_sizes=[64, 32, 1],
        )
        for arch in (self.model.dense_arch, self.model.inter_arch, self.model.over_arch):
            arch.to(self.device)
        dense_params = [
            p for n, p in self.model.named_parameters() if not n.startswith("sparse_arch.")
        ]
        self.opt = torch.optim.Adagrad(dense_params, lr=cfg.lr, eps=1e-8)
        # The input pipeline's work, done once: preprocessed sparse inputs
        # (CPU), moved to the device each step as a loader would.
        self.inputs = [self._prepare(b) for b in data.train]

    def _prepare(self, batch):
        dense, kjt, labels, _ = batch
        sparse = kjt if self.peer else self.pre(kjt)
        return dense, sparse, labels

    def _to_device(self, dense, sparse, labels):
        if self.peer:
            return dense, sparse, labels
        return dense.to(self.device), sparse.to(self.device), labels.to(self.device)

    def step(self, i: int) -> torch.Tensor:
        dense, sparse, labels = self._to_device(*self.inputs[i % len(self.inputs)])
        logits = self.model(dense, sparse).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.detach()

    def evaluate(self) -> float:
        losses = []
        with torch.no_grad():
            for b in self.data.held_out:
                dense, sparse, labels = self._to_device(*self._prepare(b))
                logits = self.model(dense, sparse).squeeze(1)
                losses.append(_logloss(logits.float().cpu(), labels.float().cpu()))
        return sum(losses) / len(losses)

    def unstacked_tables(self) -> Dict[str, torch.Tensor]:
        ebc = self.model.sparse_arch.embedding_bag_collection
        if self.peer:
            return {k.split(".")[-2]: v for k, v in ebc.state_dict().items()}
        return {k: v.cpu() for k, v in ebc.get_unstacked_table_weights().items()}


def teacher_logloss(data: ClickData) -> Tuple[float, float]:
    """Held-out log loss of the teacher's probabilities, and of the best
    constant (the click rate)."""
    probs = torch.cat([b[3] for b in data.held_out])
    labels = torch.cat([b[2] for b in data.held_out])
    teacher = float(torch.nn.functional.binary_cross_entropy(probs, labels))
    rate = float(labels.mean())
    const = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    return teacher, const


def train(steps: int, cfg: Config = Config(), peer: bool = False, log_every: int = 0):
    """Train for `steps`; returns (losses per step, held-out log loss,
    seconds per step after the first 5, the trainer)."""
    data = ClickData(cfg)
    tr = Trainer(cfg, data, peer)
    losses, times = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        loss = tr.step(i)
        losses.append(float(loss))  # reads the loss back: the step is done
        times.append(time.perf_counter() - t0)
        if log_every and (i + 1) % log_every == 0:
            print(f"step {i + 1:4d}  loss {sum(losses[-log_every:]) / log_every:.4f}", flush=True)
    warm = times[5:] or times
    return losses, tr.evaluate(), sum(warm) / len(warm), tr


def main(argv: List[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--peer", action="store_true", help="run on the CPU with fbgemm's tables instead")
    args = ap.parse_args(argv)
    cfg = Config(batch=args.batch, batches=args.steps)  # one pass over fresh clicks
    where = "CPU, fbgemm tables" if args.peer else f"tpu ({torch.tpu.platform()}), SparseCore tables"
    print(f"DLRM: {len(cfg.tables)} tables ({sum(cfg.tables)} rows x {cfg.dim}), batch {cfg.batch}, on {where}")
    losses, held_out, step_s, _ = train(args.steps, cfg, args.peer, log_every=max(1, args.steps // 10))
    teacher, const = teacher_logloss(ClickData(cfg))
    first, last = losses[: min(20, len(losses))], losses[-min(20, len(losses)):]
    print(f"training loss: {sum(first) / len(first):.4f} (first {len(first)} steps) -> "
          f"{sum(last) / len(last):.4f} (last {len(last)})")
    print(f"held-out log loss {held_out:.4f}; the teacher's {teacher:.4f}, a constant's {const:.4f}")
    lookups = sum(cfg.batch * (cfg.max_ids + 1) / 2 for _ in cfg.tables)
    print(f"step time {step_s * 1e3:.1f} ms (about {lookups / step_s / 1e6:.2f} M lookups/s with their gradients)")


if __name__ == "__main__":
    main(sys.argv[1:])
