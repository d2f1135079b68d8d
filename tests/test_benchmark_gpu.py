"""On a GPU: the forward time the benchmark reports agrees with an independent CUDA-event timing of the same
calls (events recorded on the stream inside the very steps the benchmark times)."""

import statistics

import pytest
import torch

from profiler_kit import benchmark as bench
from profiler_kit.results_io import run_sweep
from profiler_kit.workload import Workload, WorkloadConfig

pytestmark = pytest.mark.gpu
TOLERANCE = 0.05  # the acceptance bound: within 5%


class EventTimedWorkload(Workload):
    """Records a CUDA event at the start of each step and one when the forward phase ends."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.event_ms: list[float] = []

    def step(self, on_phase_end=None):
        if on_phase_end is None:  # warm-up
            return super().step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()

        def phase_end(phase):
            if phase == "forward":
                end.record()
            on_phase_end(phase)  # the benchmark's own callback synchronizes and reads its clock
            if phase == "forward":
                self.event_ms.append(start.elapsed_time(end))

        return super().step(phase_end)


@pytest.mark.parametrize("model, mixed_precision", [("small", False), ("small", True), ("large", True)])
def test_reported_forward_time_matches_cuda_events(model, mixed_precision):
    workload = EventTimedWorkload(WorkloadConfig(model, 256, "forward", mixed_precision=mixed_precision))
    samples = bench.time_steps(workload, warmup=5, steps=20)
    reported_ms = statistics.median(samples["forward"]) * 1e3
    events_ms = statistics.median(workload.event_ms)
    assert len(workload.event_ms) == 20
    assert reported_ms == pytest.approx(events_ms, rel=TOLERANCE)


def test_peak_memory_and_mfu_are_reported_on_cuda():
    row = bench.run_config(WorkloadConfig("tiny", 128, "train", device="cuda"), warmup=1, steps=2)
    assert (
        row["status"] == "ok"
        and row["peak_allocated_mb"] > 0
        and row["peak_reserved_mb"] >= row["peak_allocated_mb"]
    )
    assert row["mfu_pct"] is not None and row["device"].startswith("NVIDIA")


def test_oom_row_then_the_sweep_goes_on():
    # 2.7B with a huge batch cannot fit in 80 GB; the next config must still run on freed memory.
    big = WorkloadConfig("2.7B", 2048, "train", batch_size=64, device="cuda")
    small = WorkloadConfig("tiny", 64, "train", device="cuda")
    rows = list(run_sweep([big, small], lambda cfg: bench.run_config(cfg, warmup=0, steps=1)))
    assert [r["status"] for r in rows] == ["oom", "ok"]
