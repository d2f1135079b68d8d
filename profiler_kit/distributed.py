"""The built-in workload data-parallel under torchrun: one rank per GPU (or CPU process), the model wrapped in
DistributedDataParallel (`ddp`) or sharded with FSDP2's `fully_shard` (`fsdp`), each rank on a batch of its own.

torchrun starts the ranks and says who each one is through its environment (RANK, WORLD_SIZE, LOCAL_RANK and
the rendezvous address); `join` reads it, sets this rank's GPU and opens the process group (NCCL on GPUs, gloo
on CPUs); `gather_rows` brings every rank's row to rank 0 (what `scaling` builds the job's rows from).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from profiler_kit.errors import ProfilerKitError
from profiler_kit.names import PARALLEL_MODES

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankInfo:
    """Who this process is in its torchrun job."""

    rank: int
    world_size: int
    local_rank: int


def torchrun_rank() -> RankInfo:
    """This process's place in its torchrun job, from the variables torchrun sets; a user error outside one."""
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise ProfilerKitError(
            f"--parallel runs one rank per device under torchrun, e.g. `torchrun --nproc-per-node 2 -m profiler_kit "
            f"benchmark --parallel ddp ...`; this process has no {', '.join(missing)}"
        )
    return RankInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))


def check_mode(parallel: str) -> None:
    if parallel not in PARALLEL_MODES:
        raise ProfilerKitError(f"unknown parallel mode {parallel!r}; choose from {', '.join(PARALLEL_MODES)}")


def join(device: torch.device) -> tuple[torch.device, RankInfo]:
    """This rank's device (cuda:LOCAL_RANK on GPUs, the CPU otherwise) and place, the process group opened on
    the first call: NCCL on GPUs, gloo on CPUs."""
    info = torchrun_rank()
    if device.type == "cuda":
        if info.local_rank >= torch.cuda.device_count():
            raise ProfilerKitError(
                f"local rank {info.local_rank} has no GPU: torch sees {torch.cuda.device_count()}; start at most "
                "that many ranks per node"
            )
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # torch.distributed.nn.functional binds the world group as its functions' default argument when first
        # imported (DDP imports it); imported after the group opens, it keeps the group alive past
        # destroy_process_group, and gloo's worker threads then release tensors during interpreter shutdown,
        # which aborts the process. Imported before, it binds None.
        importlib.import_module("torch.distributed.nn.functional")
        if device.type == "cuda":
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    return device, info


def leave() -> None:
    """Close the process group, if this process opened one."""
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, parallel: str, device: torch.device, mixed_precision: bool = False) -> nn.Module:
    """`model` data-parallel over the open process group: DDP around it, or FSDP2 sharding each block's
    parameters and then the rest (embedding, final norm, LM head) at the root. With `mixed_precision`, FSDP2
    gathers the parameters in bf16 for the forward and backward and reduces the gradients in fp32
    (`MixedPrecisionPolicy`), as bf16 training with FSDP2 is run: gathering fp32 weights for bf16 autocast moves
    twice the bytes."""
    check_mode(parallel)
    if parallel == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision \
            else MixedPrecisionPolicy()
        for layer in model.layers:
            fully_shard(layer, mp_policy=policy)
        return fully_shard(model, mp_policy=policy)
    raise ProfilerKitError("parallel mode 'none' has no wrapper")


def gather_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's row on rank 0, in rank order; an empty list elsewhere."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rows: list[dict[str, Any]] | None = [{} for _ in range(world_size)] if rank == 0 else None
    dist.gather_object(row, rows, dst=0)
    return rows or []
