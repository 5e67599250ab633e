"""Training across processes: torchrun starts N copies of `minigate train`, torch.distributed joins them (DDP).

    torchrun --nproc_per_node 2 $(which minigate) train --preset ci --variant headwise --out runs/ci-ddp

Each process (a rank) holds the whole model. Every step, each rank draws the same global batch indices (the data
sampler's generator is seeded alike everywhere) and keeps its own rows of it: TrainConfig.batch_size rows split
evenly, so N processes see exactly the batches one process would. DistributedDataParallel averages the gradients,
every rank applies the same update, and rank 0 alone writes the run folder. gloo on CPU, NCCL on CUDA GPUs.

From Python, join the processes yourself (torch.distributed.init_process_group) before train(): train() trains
data-parallel whenever a process group is up. What minigate will not do (tensor, pipeline or expert parallelism)
is docs/training.md's "Training across processes".
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int = 0  # this process, 0 .. world - 1 (torchrun's RANK)
    world: int = 1  # processes in the run (WORLD_SIZE)
    local: int = 0  # this process on its machine (LOCAL_RANK): its GPU, cuda:local

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes the run folder and prints."""
        return self.rank == 0


def launched() -> bool:
    """Whether torchrun (or another launcher that sets WORLD_SIZE) started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup(device: str | None = None) -> Ranks:
    """Join the process group torchrun set up the environment for (a no-op in a single process, or when already
    joined): NCCL when this run trains on CUDA GPUs, gloo otherwise. `device`: the run's --device ("auto"/None:
    CUDA if there is one)."""
    if launched() and not dist.is_initialized():
        cuda = torch.cuda.is_available() and (device in (None, "auto") or str(device).startswith("cuda"))
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return current()


def current() -> Ranks:
    """This process's place in the run: Ranks() (rank 0 of 1) unless a process group is up."""
    if not (dist.is_available() and dist.is_initialized()):
        return Ranks()
    return Ranks(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank())))


def backend() -> str:
    """The process group's backend ("gloo", "nccl"), "" in a single process."""
    return dist.get_backend() if dist.is_available() and dist.is_initialized() else ""


def teardown():
    """Leave the process group (if one is up)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def check_batch(batch_size: int, ranks: Ranks):
    """A ValueError unless the global batch splits evenly over the processes."""
    if batch_size % ranks.world:
        raise ValueError(f"TrainConfig.batch_size={batch_size} does not split over {ranks.world} processes; use a "
                         f"batch_size that is a multiple of {ranks.world} (--set batch_size=...) or another "
                         "--nproc_per_node")


def my_rows(batch: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """This rank's rows of a global batch (batch, ...) -> (batch / world, ...): rank r keeps the r-th slice."""
    per = batch.shape[0] // ranks.world
    return batch[ranks.rank * per: (ranks.rank + 1) * per]


def mean(value: float, ranks: Ranks, device: torch.device) -> float:
    """The mean of a number over the ranks (each rank's loss on its rows -> the loss on the global batch)."""
    if ranks.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / ranks.world


def any_rank(flag: bool, ranks: Ranks, device: torch.device) -> bool:
    """True on every rank if it is True on any: a stop that one process received, agreed at a step's end, so all
    ranks stop after the same step."""
    if ranks.world == 1:
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


class RankZeroStopped(RuntimeError):
    """Rank 0 could not start the run (a bad folder, a checkpoint to resume without --resume, ...); it said why."""


def _rank_zero_says(ranks: Ranks, ok: bool = True) -> bool:
    """Every rank gets rank 0's `ok` (a broadcast; a no-op in a single process)."""
    if ranks.world == 1:
        return ok
    t = torch.tensor([int(ok)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.broadcast(t, src=0)
    return bool(t.item())


@contextmanager
def rank_zero_first(ranks: Ranks):
    """Rank 0 checks and prepares the run folder while the other ranks wait at the start of the block:

        with rank_zero_first(ranks) as checked:
            if not ranks.main:
                ...             # runs once rank 0 called checked(); RankZeroStopped if rank 0 raised before it
            ...                 # rank 0: check, lock, write run.json
            checked()           # the other ranks go on now

    If rank 0's block raises before checked(), the other ranks raise RankZeroStopped instead of waiting forever."""
    if not ranks.main:
        if not _rank_zero_says(ranks):
            raise RankZeroStopped("rank 0 could not start the run; its error says why")
        yield lambda: None
        return
    said = False

    def checked():
        nonlocal said
        said = True
        _rank_zero_says(ranks)

    try:
        yield checked
    except BaseException:
        if not said:  # a check failed: the other ranks stop too
            _rank_zero_says(ranks, ok=False)
        raise


def barrier(ranks: Ranks):
    if ranks.world > 1:
        dist.barrier()
