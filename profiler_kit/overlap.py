"""The optimizer beside the backward: one optimizer per block of parameters, each stepped as soon as its block's
gradients are final.

`BlockOptimizers` gives each group of parameters (the model's blocks) an optimizer of its own, made by one
factory, and steps them either one after another once the backward is over (`step`) or, when armed before the
backward (`arm`), from inside it: a post-accumulate-grad hook on every parameter counts the group's gradients,
and the last one launches the group's update. On a GPU the update runs on a stream of its own behind an event
recorded where the gradient was made, so that it overlaps the backward of the blocks before it; `finish` then
updates the groups none of whose gradients came, and makes the current stream wait for every update. On a CPU
the update runs inside the hook. Each element is updated by the same kernel on the same values either way, so
the numerics are those of the sequential step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import nn

from profiler_kit.errors import ProfilerKitError


def block_groups(model: nn.Module) -> list[list[nn.Parameter]]:
    """The parameters of `model` in groups whose gradients become final together: each of its `layers`, and
    every parameter outside them as a group of its own, in the order the model holds them."""
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ProfilerKitError("the optimizer beside the backward needs a model with `layers` (its blocks)")
    in_layers = {id(p) for p in layers.parameters()}
    groups = [[p] for p in model.parameters() if id(p) not in in_layers and p.requires_grad]
    groups += [[p for p in layer.parameters() if p.requires_grad] for layer in layers]
    return [g for g in groups if g]


class BlockOptimizers:
    """One optimizer per parameter group (`make(params)` builds each), stepped after the backward or beside it.

    `stream`: where the updates beside the backward run on a GPU (None: a new stream of the lowest priority, so
    that the backward's kernels go first wherever both wait for the GPU)."""

    def __init__(self, groups: Sequence[Sequence[nn.Parameter]],
                 make: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 stream: torch.cuda.Stream | None = None) -> None:
        self.groups = [list(g) for g in groups]
        self.optimizers = [make(g) for g in self.groups]
        device = self.groups[0][0].device
        self.stream = (stream or torch.cuda.Stream(device)) if device.type == "cuda" else None
        self._events = [torch.cuda.Event() for _ in self.groups] if self.stream is not None else []
        self._armed = False
        self._waiting = [0] * len(self.groups)
        self._launched = [False] * len(self.groups)
        for index, group in enumerate(self.groups):
            for p in group:
                p.register_post_accumulate_grad_hook(partial(self._on_gradient, index))

    def step(self) -> None:
        """Every group's update, one after another (the step after the backward)."""
        for optimizer in self.optimizers:
            optimizer.step()

    def arm(self) -> None:
        """Update each group from the coming backward as soon as its gradients are final."""
        self._waiting = [len(g) for g in self.groups]
        self._launched = [False] * len(self.groups)
        self._armed = True

    def finish(self) -> None:
        """After an armed backward: update the groups not updated yet (none of their gradients came) and make the
        current stream wait for every update."""
        for index, launched in enumerate(self._launched):
            if not launched:
                self._launch(index)
        self._armed = False
        if self.stream is not None:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)

    def _on_gradient(self, index: int, param: nn.Parameter) -> None:
        if not self._armed:
            return
        self._waiting[index] -= 1
        if self._waiting[index] == 0:
            self._launch(index)

    def _launch(self, index: int) -> None:
        self._launched[index] = True
        if self.stream is None:
            self.optimizers[index].step()
            return
        # Recorded on the stream the gradient was made on (the autograd engine's current stream in the hook).
        event = self._events[index]
        event.record()
        self.stream.wait_event(event)
        with torch.cuda.stream(self.stream):
            self.optimizers[index].step()

    def write_captured_tables(self) -> None:
        """After a CUDA graph captured the updates: let each optimizer that keeps tables of addresses for its
        kernel write them (`MasterWeightAdamW`)."""
        for optimizer in self.optimizers:
            write = getattr(optimizer, "write_captured_tables", None)
            if write is not None:
                write()
