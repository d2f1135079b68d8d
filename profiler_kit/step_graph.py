"""A whole training step captured in one CUDA graph and replayed.

`StepGraph` runs a step's `body` the first `warmup` times on its own stream (compilation, autotuning and the
optimizer's lazily made state happen there, outside any capture), captures the next call into one CUDA graph
on that stream (the work the body forks to other streams included, such as the optimizer's updates beside the
backward) and replays the graph from then on: one launch a step. The tensors the body makes (gradients, the
loss) keep their memory in the graph's pool, so they stay where the capture put them; `release` drops those
the warm-up made before the capture, `after_capture` lets the body's parts write what depends on those
addresses (`MasterWeightAdamW.write_captured_tables`).

Phase boundaries: during the warm-up the body calls `on_phase_end(phase)` as any step does; in the capture the
body's calls record events (with timing, external: each replay records them again), the first at the step's
start, which `events` holds for the caller to read after each replay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# Untimed calls before the capture: the first compiles the step and makes the optimizer's state.
WARMUP_STEPS = 3

Body = Callable[[Callable[[str], None] | None], torch.Tensor]


def on_stream(stream: torch.cuda.Stream, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`fn()` run with `stream` current, after the work queued on the current stream and before what is queued
    there next."""
    current = torch.cuda.current_stream(stream.device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        out = fn()
    current.wait_stream(stream)
    return out


class StepGraph:
    """`body(on_phase_end)` run as warm-up, then captured and replayed; `phases` are the names the body ends."""

    def __init__(self, body: Body, device: torch.device, phases: Sequence[str], stream: torch.cuda.Stream,
                 release: Callable[[], None], after_capture: Sequence[Callable[[], None]] = (),
                 warmup: int = WARMUP_STEPS) -> None:
        self.body, self.device, self.stream = body, device, stream
        self.phases = tuple(phases)
        self.release, self.after_capture, self.warmup = release, tuple(after_capture), warmup
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.loss: torch.Tensor | None = None
        self.events: list[torch.cuda.Event] | None = None

    def __call__(self, on_phase_end: Callable[[str], None] | None = None) -> torch.Tensor:
        """One step: a warm-up run, else a replay (after capturing the graph on the first call past the
        warm-up). The loss tensor a replay returns is the graph's, rewritten by the next replay."""
        self.calls += 1
        if self.graph is None and self.calls <= self.warmup:
            return on_stream(self.stream, lambda: self.body(on_phase_end))
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.loss

    def _capture(self) -> None:
        torch.cuda.synchronize(self.device)
        self.release()
        events = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(len(self.phases) + 1)]
        ends = iter(events[1:])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            events[0].record()
            self.loss = self.body(lambda phase: next(ends).record())
        for write in self.after_capture:
            write()
        self.graph, self.events = graph, events
