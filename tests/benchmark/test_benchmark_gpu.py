"""On a GPU: phase times come from CUDA events with one synchronize per step, and the times the benchmark
reports agree with an independent CUDA-event timing of the same steps."""

import statistics

import pytest
import torch

from profiler_kit import benchmark as bench
from profiler_kit.results_io import run_sweep
from profiler_kit.workload import Workload, WorkloadConfig

pytestmark = pytest.mark.gpu
TOLERANCE = 0.05  # the acceptance bound: within 5%


def fixed(warmup, steps):
    return bench.TimingOptions(warmup=warmup, max_warmup=0, steps=steps)


class EventTimedWorkload(Workload):
    """Records its own CUDA events around each timed step and at the end of its forward phase."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event, torch.cuda.Event]] = []

    def step(self, on_phase_end=None):
        if on_phase_end is None:  # warm-up
            return super().step()
        start, forward_end, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()

        def phase_end(phase):
            if phase == "forward":
                forward_end.record()
            on_phase_end(phase)

        loss = super().step(phase_end)
        end.record()
        self.events.append((start, forward_end, end))
        return loss


@pytest.mark.parametrize("model, mode, mixed_precision",
                         [("small", "forward", False), ("small", "train", True),
                          pytest.param("large", "train", True, marks=pytest.mark.gpu_slow)])
def test_reported_times_match_independent_cuda_events(model, mode, mixed_precision):
    workload = EventTimedWorkload(WorkloadConfig(model, 256, mode, mixed_precision=mixed_precision))
    result = bench.time_steps(workload, fixed(5, 20))
    torch.cuda.synchronize()
    assert len(workload.events) == 20
    forward_ms = statistics.median(s.elapsed_time(f) for s, f, _ in workload.events)
    step_ms = statistics.median(s.elapsed_time(e) for s, _, e in workload.events)
    assert statistics.median(result.samples["forward"]) * 1e3 == pytest.approx(forward_ms, rel=TOLERANCE)
    assert statistics.median(result.samples["total"]) * 1e3 == pytest.approx(step_ms, rel=TOLERANCE)


class SleepWorkload:
    """Phases that only queue GPU work (a spin of `cycles`, twice as long in backward): the host returns at once,
    so only events on the stream can see how long each phase runs."""

    device = torch.device("cuda")
    phases = ("forward", "backward")

    def __init__(self, cycles):
        self.cycles = cycles

    def step(self, on_phase_end=None):
        for phase, factor in (("forward", 1), ("backward", 2)):
            torch.cuda._sleep(self.cycles * factor)
            if on_phase_end:
                on_phase_end(phase)


def test_phase_times_are_cuda_events_with_one_synchronize_per_step(monkeypatch):
    syncs = []
    real = bench.synchronize
    monkeypatch.setattr(bench, "synchronize", lambda device: syncs.append(device) or real(device))
    result = bench.time_steps(SleepWorkload(cycles=10_000_000), fixed(2, 5))
    assert len(syncs) == 1 + 2 + 5  # before the warm-up, then one per step
    forward, backward, total = (statistics.median(result.samples[k]) for k in ("forward", "backward", "total"))
    assert forward > 1e-3 and backward == pytest.approx(2 * forward, rel=0.1)
    assert total == pytest.approx(forward + backward, rel=0.1)


def test_peak_memory_and_mfu_are_reported_on_cuda():
    row = bench.run_config(WorkloadConfig("tiny", 128, "train", device="cuda"), fixed(1, 2))
    assert (
        row["status"] == "ok"
        and row["peak_allocated_mib"] > 0
        and row["peak_reserved_mib"] >= row["peak_allocated_mib"]
    )
    assert row["mfu_pct"] is not None and row["device"].startswith("NVIDIA")


def test_oom_row_then_the_sweep_goes_on():
    # 2.7B with a huge batch cannot fit in 80 GB; the next config must still run on freed memory.
    big = WorkloadConfig("2.7B", 2048, "train", batch_size=64, device="cuda")
    small = WorkloadConfig("tiny", 64, "train", device="cuda")
    rows = list(run_sweep([big, small], lambda cfg: [bench.run_config(cfg, fixed(0, 1))]))
    assert [r["status"] for r in rows] == ["oom", "ok"]


@pytest.mark.gpu_slow  # torch.compile
def test_cuda_graphs_replay_the_compiled_step():
    """With --cuda-graphs every compiled step replays CUDA graphs (no partition skipped) and trains like eager."""
    from torch._dynamo.utils import counters

    counters.clear()
    cfg = WorkloadConfig("tiny", 128, "train", device="cuda", compile=True, cuda_graphs=True)
    graphed, eager = Workload(cfg), Workload(WorkloadConfig("tiny", 128, "train", device="cuda"))
    losses = [(graphed.step().item(), eager.step().item()) for _ in range(4)]
    assert not counters["inductor"]["cudagraph_skips"]
    for got, want in losses:
        assert got == pytest.approx(want, rel=1e-3)
