"""A TPU slice as a gang of Ray actors, one per host.

Ray schedules and places (``ray.util.tpu.SlicePlacementGroup``: one
bundle per host, all on hosts carrying the same slice-name label); tpurt
owns the chips: each host actor opens the runtime, which shows it the chips
Ray made visible (``TPU_VISIBLE_CHIPS``) with their slice coordinates.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.tpu import SlicePlacementGroup

from .host import remote_host_class
from .topology import slice_shape

log = logging.getLogger("tpurt_ray")


class SliceError(RuntimeError):
    """The slice could not be formed, or a host of it failed."""


class HostFailed(SliceError):
    """The actor of rank `rank` (host `worker_id`, and `chip` for a slice of
    one actor per chip) died or did not answer."""

    def __init__(self, rank: int, worker_id: int, chip: Optional[int], cause: BaseException):
        where = f"host {worker_id}" if chip is None else f"chip {chip} of host {worker_id}"
        super().__init__(f"{where} of the slice failed: {type(cause).__name__}: {cause}")
        self.rank = rank
        self.worker_id = worker_id
        self.chip = chip
        self.cause = cause


@dataclasses.dataclass
class HostHealth:
    """One actor's health: `rank` in the slice, on host `worker_id`."""

    rank: int
    worker_id: int
    alive: bool
    chips: List[Dict[str, Any]]
    error: Optional[str] = None

    @property
    def healthy(self) -> bool:
        return self.alive and bool(self.chips) and all(c["ok"] for c in self.chips)


@dataclasses.dataclass
class SliceHealth:
    hosts: List[HostHealth]

    @property
    def healthy(self) -> bool:
        return all(h.healthy for h in self.hosts)

    def failed(self) -> List[int]:
        """The ranks of the actors that are not healthy."""
        return [h.rank for h in self.hosts if not h.healthy]


class TpuSlice:
    """A TPU slice of `topology` chips of `accelerator_version`: one actor
    per host, or with ``per_chip=True`` one actor per chip (what
    ``DistributedDataParallel`` needs: one device per process).

    ``run(fn, ...)`` calls ``fn(ctx, ...)`` in every actor at once
    (:class:`tpurt_ray.HostContext`) and returns the results in rank order
    (hosts in worker order, chips in their order on the host);
    ``health()`` checks every actor and every chip; ``shutdown()`` (or
    leaving a ``with`` block) releases the actors and the reservation.
    """

    def __init__(
        self,
        topology: str,
        accelerator_version: str,
        *,
        chips_per_host: Optional[int] = None,
        per_chip: bool = False,
        ready_timeout_s: float = 120.0,
        actor_options: Optional[Dict[str, Any]] = None,
    ):
        self.shape = slice_shape(topology, accelerator_version, chips_per_host)
        self.per_chip = per_chip
        self._ready_timeout_s = ready_timeout_s
        self._actor_options = dict(actor_options or {})
        self._pg: Optional[SlicePlacementGroup] = None
        # Members by (worker id, first chip on the host): the rank order.
        n, c = self.shape.num_hosts, self.shape.chips_per_host
        self._keys = [(w, i) for w in range(n) for i in range(c)] if per_chip else [(w, 0) for w in range(n)]
        self._by_key: Dict[tuple, tuple] = {}  # key -> (actor, bundle, info)
        self._collectives: Optional[str] = None
        self.name: Optional[str] = None
        self.events: List[Dict[str, Any]] = []
        t0 = time.perf_counter()
        try:
            try:
                self._pg = SlicePlacementGroup(
                    topology=self.shape.topology,
                    accelerator_version=self.shape.accelerator_version,
                    chips_per_vm=self.shape.chips_per_host,
                    head_reservation_timeout_s=ready_timeout_s,
                )
            except (TimeoutError, RuntimeError) as e:
                raise SliceError(
                    f"no free {self.shape.pod_type} slice ({self.shape.topology}, {self.shape.num_hosts} hosts "
                    f"of {self.shape.chips_per_host} chips) within {ready_timeout_s:.0f} s: {e}"
                ) from e
            self._wait_ready()
            self._pg.release_head_pgs()
            per_bundle = c if per_chip else 1
            self._start([b for b in range(self._pg.num_bundles) for _ in range(per_bundle)], set(self._keys))
        except BaseException:
            self.shutdown()
            raise
        self.startup_s = time.perf_counter() - t0
        self._event("formed", actors=len(self._keys), seconds=round(self.startup_s, 3))

    # --- forming -------------------------------------------------------------

    def _event(self, what: str, **fields: Any) -> None:
        e = {"time": time.time(), "event": what, "slice": self.name, **fields}
        self.events.append(e)
        log.info("slice %s: %s %s", self.name, what, {k: v for k, v in fields.items()})

    def _wait_ready(self) -> None:
        pg = self._pg.placement_group
        ready, _ = ray.wait([pg.ready()], timeout=self._ready_timeout_s)
        if not ready:
            raise SliceError(
                f"no {self.shape.pod_type} slice ({self.shape.topology}, {self.shape.num_hosts} hosts of "
                f"{self.shape.chips_per_host} chips) became free within {self._ready_timeout_s:.0f} s"
            )

    def _new_actor(self, bundle: int):
        chips = 1 if self.per_chip else self.shape.chips_per_host
        opts = {
            "num_cpus": 0,
            "resources": {"TPU": chips},
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self._pg.placement_group,
                placement_group_bundle_index=bundle,
            ),
            **self._actor_options,
        }
        return remote_host_class().options(**opts).remote(self.name or "", chips, self.shape.chips_per_host)

    def _start(self, bundles: List[int], want: set) -> None:
        """Start one actor per entry of `bundles`; they must come up as the
        members `want` (by worker id and chip)."""
        actors = [self._new_actor(b) for b in bundles]

        def fail(msg: str, cause: Optional[BaseException] = None):
            for a in actors:
                ray.kill(a, no_restart=True)
            raise SliceError(msg) from cause

        try:
            infos = ray.get([a.describe.remote() for a in actors], timeout=self._ready_timeout_s)
        except Exception as e:
            fail(f"the slice's actors did not start: {e}", e)
        got = [tuple(i["rank_key"]) for i in infos]
        if sorted(got) != sorted(want):
            fail(f"the slice's actors came up as (worker, chip) {sorted(got)}; expected {sorted(want)}")
        names = {i["slice_name"] for i in infos} | ({self.name} if self.name else set())
        if len(names) != 1:
            fail(f"the slice's actors landed on hosts of different slices: {sorted(names)}")
        self.name = names.pop()
        for a, b, info, key in zip(actors, bundles, infos, got):
            # Where each chip sits in the whole slice. (An actor holding
            # part of a host sees itself as a slice of its own, as Ray's
            # sub-host variables say, so its runtime cannot tell.)
            info["slice_coords"] = [self.shape.chip_coords(info["worker_id"], c) for c in info["host_chips"]]
            self._by_key[key] = (a, b, info)
        world = len(self._keys)
        ray.get([self._by_key[k][0].set_rank.remote(r, world) for r, k in enumerate(self._keys)])

    @property
    def _hosts(self) -> List[Any]:
        """The actors, in rank order."""
        return [self._by_key[k][0] for k in self._keys]

    @property
    def host_info(self) -> List[Dict[str, Any]]:
        """What each actor reported when it started, in rank order."""
        return [self._by_key[k][2] for k in self._keys]

    # --- use -------------------------------------------------------------------

    @property
    def num_hosts(self) -> int:
        return self.shape.num_hosts

    @property
    def world(self) -> int:
        """How many actors the slice has (hosts, or chips with ``per_chip``)."""
        return len(self._keys)

    def run_async(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List["ray.ObjectRef"]:
        """Start ``fn(ctx, *args, **kwargs)`` on every host; object refs in worker order."""
        return [h.run.remote(fn, args, kwargs) for h in self._hosts]

    def run(self, fn: Callable[..., Any], *args: Any, timeout: Optional[float] = None, **kwargs: Any) -> List[Any]:
        """``fn(ctx, *args, **kwargs)`` on every host; results in worker order.
        A host that dies raises :class:`HostFailed` naming it (the others'
        calls still finish)."""
        refs = self.run_async(fn, *args, **kwargs)
        return self._gather(refs, timeout)

    def _gather(self, refs, timeout: Optional[float]) -> List[Any]:
        """Every host's result. A host whose actor died (or did not answer in
        `timeout`) is a :class:`HostFailed`, and it outranks errors the other
        hosts raised because of it (a collective whose peer vanished); with
        no host lost, the first host's own error is raised as it is."""
        results: List[Any] = []
        lost: Optional[HostFailed] = None
        error: Optional[BaseException] = None
        for w, r in enumerate(refs):
            try:
                results.append(ray.get(r, timeout=timeout))
                continue
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                worker, chip = self._keys[w]
                lost = lost or HostFailed(w, worker, chip if self.per_chip else None, e)
            except ray.exceptions.RayTaskError as e:
                error = error or e
            results.append(None)
        if lost is not None:
            self._event("host failed", rank=lost.rank, worker_id=lost.worker_id, chip=lost.chip,
                        cause=type(lost.cause).__name__)
            raise lost
        if error is not None:
            raise error
        return results

    def health(self, timeout_s: float = 30.0) -> SliceHealth:
        """Whether each host actor answers, and a probe op on each of its chips."""
        refs = [h.probe.remote() for h in self._hosts]
        hosts = []
        for w, r in enumerate(refs):
            try:
                hosts.append(HostHealth(w, self._keys[w][0], True, ray.get(r, timeout=timeout_s)))
            except Exception as e:
                hosts.append(HostHealth(w, self._keys[w][0], False, [], f"{type(e).__name__}: {e}"))
        return SliceHealth(hosts)

    # --- collectives ---------------------------------------------------------

    def init_collectives(self, backend: Optional[str] = None, timeout_s: float = 120.0) -> None:
        """Put the actors in one torch.distributed group, rank = their rank
        in the slice, for ``dist.all_reduce`` and friends (and, with one
        actor per chip, ``DistributedDataParallel``) in functions run on the
        slice. `backend`: ``"gloo"`` (host memory) for host actors,
        ``"cpu:gloo,tpu:tpurt"`` (tpu tensors too) for chip actors by
        default. Called again after a recovery, with a fresh rendezvous."""
        backend = backend or ("cpu:gloo,tpu:tpurt" if self.per_chip else "gloo")
        first = self._hosts[0]
        addr, port = ray.get([first.address.remote(), first.free_port.remote()], timeout=timeout_s)
        init = f"tcp://{addr}:{port}"
        refs = [h.init_collectives.remote(init, backend, timeout_s) for h in self._hosts]
        self._gather(refs, timeout_s + 30)
        self._collectives = backend
        self._event("collectives formed", backend=backend, init_method=init)

    # --- recovery --------------------------------------------------------------

    def _alive(self, timeout_s: float) -> List[bool]:
        refs = [h.ping.remote() for h in self._hosts]
        alive = []
        for r in refs:
            try:
                ray.get(r, timeout=timeout_s)
                alive.append(True)
            except Exception:
                alive.append(False)
        return alive

    def _wait_bundles(self, timeout_s: float) -> None:
        """Wait until Ray has placed every bundle again (after a node was lost,
        its bundles wait for a replacement host of the same slice)."""
        from ray.util.placement_group import placement_group_table

        deadline = time.monotonic() + timeout_s
        pg = self._pg.placement_group
        while True:
            state = placement_group_table(pg).get("state")
            if state == "CREATED":
                return
            if time.monotonic() > deadline:
                raise SliceError(
                    f"slice {self.name}: the lost hosts were not replaced within {timeout_s:.0f} s "
                    f"(placement group {state})"
                )
            time.sleep(0.2)

    def recover(self, policy: str = "host", timeout_s: Optional[float] = None) -> List[int]:
        """Re-form the slice after a failure. ``policy="host"`` restarts the
        actors that are gone (on the same node if it lives, else on the
        replacement Ray places in their bundle); ``"slice"`` restarts every
        actor. Returns the ranks restarted. State kept in the actors is
        lost: restore it from a checkpoint (:meth:`train` does)."""
        if policy not in ("host", "slice"):
            raise ValueError(f"policy must be 'host' or 'slice', not {policy!r}")
        timeout_s = self._ready_timeout_s if timeout_s is None else timeout_s
        t0 = time.perf_counter()
        alive = self._alive(timeout_s=10.0)
        restart = [r for r, ok in enumerate(alive) if not ok or policy == "slice"]
        self._event("recovering", policy=policy, dead=[r for r, ok in enumerate(alive) if not ok], restart=restart)
        keys = [self._keys[r] for r in restart]
        for k in keys:
            try:
                ray.kill(self._by_key[k][0], no_restart=True)
            except Exception:
                pass
        bundles = [self._by_key[k][1] for k in keys]
        for k in keys:
            del self._by_key[k]
        deadline = time.monotonic() + timeout_s
        while True:
            self._wait_bundles(max(1.0, deadline - time.monotonic()))
            try:
                self._start(bundles, set(keys))
                break
            except SliceError as e:
                # Ray may not have noticed a lost node yet: its bundles still
                # look placed, and actors started there die with it. Try
                # again once it has, until the deadline.
                if time.monotonic() > deadline:
                    raise
                self._event("restart failed, retrying", error=str(e).splitlines()[0])
                time.sleep(1.0)
        if self._collectives:
            self.init_collectives(self._collectives)
        self.last_recovery_s = time.perf_counter() - t0
        self._event("recovered", restarted=restart, seconds=round(self.last_recovery_s, 3))
        return restart

    def train(
        self,
        setup: Callable[..., Any],
        step: Callable[..., Any],
        save: Callable[..., Any],
        *,
        steps: int,
        checkpoint_every: int = 1,
        policy: str = "host",
        max_recoveries: int = 3,
        collectives: bool = True,
        step_timeout_s: Optional[float] = None,
        on_step: Optional[Callable[[int, List[Any]], None]] = None,
        checkpoint_dir: Optional[str] = None,
    ) -> Dict[str, Any]:
        """A fault-tolerant loop over the slice.

        ``setup(ctx, checkpoint)`` builds each host's state (``ctx.state``)
        from ``checkpoint`` (None at the start); ``step(ctx, i)`` runs step
        ``i`` on every host; ``save(ctx)`` returns the state to checkpoint
        (taken from worker 0, every ``checkpoint_every`` steps); ``on_step(i, results)``,
        if given, runs here after step ``i`` completed. When a host
        fails, the slice is recovered with ``policy``, every host is set up
        again from the last checkpoint, and the steps after it run again:
        each step's effect lands in the result exactly once. With
        ``checkpoint_dir``, each checkpoint is also written there (whole or
        not at all), and a later call with the same directory resumes from
        the last one, so the loop survives the driver too. Returns the
        last step's results, the final checkpoint and what happened."""
        if steps < 0 or checkpoint_every < 1:
            raise ValueError("steps must be >= 0 and checkpoint_every >= 1")
        if collectives and not self._collectives:
            self.init_collectives()
        checkpoint: Dict[str, Any] = {"step": 0, "state": None}
        if checkpoint_dir is not None:
            found = _load_checkpoint(checkpoint_dir)
            if found is not None:
                checkpoint = found
                self._event("resumed from disk", step=checkpoint["step"], dir=checkpoint_dir)
        recoveries, replayed, last = 0, 0, None
        i = checkpoint["step"]
        needs_setup = True
        while i < steps or needs_setup:
            try:
                if needs_setup:
                    self.run(setup, checkpoint["state"])
                    needs_setup = False
                    continue
                last = self.run(step, i, timeout=step_timeout_s)
                i += 1
                if i % checkpoint_every == 0 or i == steps:
                    checkpoint = {"step": i, "state": self.run(save)[0]}
                    if checkpoint_dir is not None:
                        _store_checkpoint(checkpoint_dir, checkpoint)
                    self._event("checkpoint", step=i)
                if on_step is not None:
                    on_step(i, last)
            except HostFailed as failure:
                if recoveries >= max_recoveries:
                    raise
                recoveries += 1
                self.recover(policy)
                # The step in flight, and those done since the checkpoint,
                # run again from the checkpoint's state.
                if not needs_setup:
                    replayed += i - checkpoint["step"] + 1
                i = checkpoint["step"]
                needs_setup = True
                self._event("resuming", step=i, after=str(failure).splitlines()[0])
        return {"results": last, "checkpoint": checkpoint, "recoveries": recoveries, "steps_replayed": replayed}

    def shutdown(self) -> None:
        for a, _, _ in list(getattr(self, "_by_key", {}).values()):
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self._by_key = {}
        if self._pg is not None:
            self._pg.shutdown()
            self._pg = None

    def __enter__(self) -> "TpuSlice":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


_CHECKPOINT = "tpurt-ray-checkpoint.pt"


def _store_checkpoint(directory: str, checkpoint: Dict[str, Any]) -> None:
    """Write then rename: a reader sees the previous checkpoint or this one."""
    import os

    import torch

    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, _CHECKPOINT)
    tmp = f"{final}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)


def _load_checkpoint(directory: str) -> Optional[Dict[str, Any]]:
    import os

    import torch

    path = os.path.join(directory, _CHECKPOINT)
    if not os.path.exists(path):
        return None
    try:
        ckpt = torch.load(path, weights_only=False)
    except Exception as e:
        raise SliceError(f"checkpoint {path} cannot be read: {e}") from e
    if not isinstance(ckpt, dict) or "step" not in ckpt or "state" not in ckpt:
        raise SliceError(f"checkpoint {path} is not a tpurt_ray checkpoint (no 'step' and 'state')")
    return ckpt
