"""Which kernels ran and with which configs: the launch record the launchers return.

The autograd Function keeps the record of its forward and backward on its context (`out.grad_fn`), where
`launch_record` finds it; the benchmark reports it in each row's message.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch: its role ("fwd", "dkdv", "dq") and its config, e.g. "128x64 w8 s3 head-first"."""

    kernel: str
    config: str


@dataclass(frozen=True)
class LaunchRecord:
    """The launches of one call, in order."""

    launches: tuple[KernelLaunch, ...] = ()

    def __add__(self, other: LaunchRecord) -> LaunchRecord:
        return LaunchRecord(self.launches + other.launches)

    def describe(self) -> str:
        """One line for a result row: "fwd 128x64 w8 s3; dkdv gluon fused 128x64 s2"."""
        return "; ".join(f"{launch.kernel} {launch.config}" for launch in self.launches)


def launch_record(out: torch.Tensor) -> LaunchRecord | None:
    """The record kept by the flash autograd Function that made `out`; None for any other tensor."""
    return getattr(out.grad_fn, "launch_record", None)
