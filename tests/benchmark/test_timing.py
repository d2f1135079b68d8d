"""The timing mechanics of the benchmark: which steps are timed, how warm-up ends, one synchronize per step, the
collector and the progress display quiet inside timed steps, and the statistics of a row."""

import gc
import threading
import time

import pandas as pd
import pytest
import rich.progress
import torch
from click.testing import CliRunner

from profiler_kit import benchmark as bench
from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.master_weights import MasterWeightAdamW
from profiler_kit.workload import MASTER_WEIGHTS, OPTIMIZERS, Workload, WorkloadConfig, release

FIXED = dict(max_warmup=0, stable_pct=2.0)
# CPU time the spinning step uses, in seconds.
SPIN_S = 0.05


class FakeWorkload:
    """Advances a fake clock by `warm(i)` seconds for the i-th warm-up step (called without phase marks) and by
    1 s per phase of a timed step; logs what happens, in order."""

    device = torch.device("cpu")
    phases = ("forward", "backward", "optimizer_step")

    def __init__(self, clock, warm=lambda i: 100.0):
        self.clock, self.warm = clock, warm
        self.calls, self.log = [], []

    def step(self, on_phase_end=None):
        self.calls.append(on_phase_end is not None)
        self.log.append("step")
        if on_phase_end is None:
            self.clock[0] += self.warm(self.calls.count(False) - 1)
            return
        for phase in self.phases:
            self.clock[0] += 1.0
            self.log.append(phase)
            on_phase_end(phase)


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: now[0])
    return now


def test_warmup_is_never_timed_and_exactly_steps_are(clock):
    workload = FakeWorkload(clock)
    result = bench.time_steps(workload, bench.TimingOptions(warmup=3, steps=4, **FIXED))
    assert workload.calls == [False] * 3 + [True] * 4
    host_cpu = result.samples.pop("host_cpu")
    assert result.samples == {"forward": [1.0] * 4, "backward": [1.0] * 4, "optimizer_step": [1.0] * 4,
                              "total": [3.0] * 4}  # fmt: skip
    assert len(host_cpu) == 4
    assert result.warmup_steps == 3


def test_warmup_runs_until_the_step_time_settles(clock):
    # 64, 32, 16, 8, 4, then 2 s forever: the last two windows of five agree once nine steps of 2 s have run.
    workload = FakeWorkload(clock, warm=lambda i: max(2.0, 64.0 / 2**i))
    result = bench.time_steps(workload, bench.TimingOptions(warmup=2, max_warmup=50, steps=1, stable_pct=1.0))
    assert result.warmup_steps == 5 + 2 * bench.STABLE_WINDOW - 2 and result.warmup_stable
    assert workload.calls.count(False) == result.warmup_steps and len(result.samples["total"]) == 1


def test_warmup_stops_at_the_cap_when_the_time_never_settles(clock):
    workload = FakeWorkload(clock, warm=lambda i: 1.0 + i)  # slower every step
    result = bench.time_steps(workload, bench.TimingOptions(warmup=1, max_warmup=17, steps=2, stable_pct=1.0))
    assert result.warmup_steps == 17 and not result.warmup_stable
    assert workload.calls == [False] * 17 + [True] * 2


def test_one_synchronize_per_step_and_none_inside_a_step(monkeypatch, clock):
    workload = FakeWorkload(clock)
    monkeypatch.setattr(bench, "synchronize", lambda device: workload.log.append("sync"))
    bench.time_steps(workload, bench.TimingOptions(warmup=2, steps=3, **FIXED))
    after_first = workload.log[workload.log.index("step"):]
    assert after_first == ["step", "sync"] * 2 + ["step", "forward", "backward", "optimizer_step", "sync"] * 3


def test_the_collector_is_off_inside_timed_steps_and_back_after():
    collections_in_steps, enabled_in_steps, in_step = [], [], [False]

    def on_collect(phase, info):
        if phase == "start" and in_step[0]:
            collections_in_steps.append(info)

    class GarbageWorkload(FakeWorkload):
        def step(self, on_phase_end=None):
            in_step[0] = True
            enabled_in_steps.append(gc.isenabled())
            for _ in range(5000):  # cyclic garbage, far past the collector's first threshold
                a = []
                a.append(a)
            super().step(on_phase_end)
            in_step[0] = False

    gc.callbacks.append(on_collect)
    try:
        bench.time_steps(GarbageWorkload([0.0]), bench.TimingOptions(warmup=2, steps=3, **FIXED))
    finally:
        gc.callbacks.remove(on_collect)
    assert enabled_in_steps == [False] * 5 and collections_in_steps == []
    assert gc.isenabled()


def test_status_is_reported_between_warmup_steps_never_between_timed_ones(clock):
    log = []
    workload = FakeWorkload(clock)
    workload.log = log
    bench.time_steps(workload, bench.TimingOptions(warmup=2, steps=3, **FIXED), on_status=log.append)
    assert log[:4] == ["warm-up 1", "step", "warm-up 2", "step"]
    assert log[4] == "timing 3 steps" and all(not e.startswith(("warm", "timing")) for e in log[5:])


def test_the_display_is_quiet_inside_timed_steps(monkeypatch):
    """Through the command: no refresh thread runs and no redraw happens while a timed step runs."""
    in_timed_step, refreshes_in_steps, threads_in_steps = [False], [], []
    threads_before = set(threading.enumerate())
    real_step, real_refresh = Workload.step, rich.progress.Progress.refresh

    def step(self, on_phase_end=None):
        in_timed_step[0] = on_phase_end is not None
        if in_timed_step[0]:
            threads_in_steps.append(set(threading.enumerate()) - threads_before)
        try:
            return real_step(self, on_phase_end)
        finally:
            in_timed_step[0] = False

    def refresh(self):
        refreshes_in_steps.append(in_timed_step[0])
        return real_refresh(self)

    monkeypatch.setattr(Workload, "step", step)
    monkeypatch.setattr(rich.progress.Progress, "refresh", refresh)
    result = CliRunner().invoke(main, ["benchmark", "--model", "tiny", "--ctx", "8", "--mode", "forward",
                                       "--device", "cpu", "--warmup", "2", "--max-warmup", "0", "--steps", "3"])
    assert result.exit_code == 0, result.output
    assert threads_in_steps == [set()] * 3
    assert refreshes_in_steps and not any(refreshes_in_steps)  # the display did redraw, only between steps


def test_settled_compares_the_medians_of_the_last_two_windows():
    w = bench.STABLE_WINDOW
    assert not bench.settled([1.0] * (2 * w - 1), 1.0)
    assert bench.settled([5.0] + [1.0] * (2 * w), 1.0)
    assert bench.settled([1.0] * (2 * w - 1) + [9.0], 1.0)  # one slow step does not restart the wait
    assert not bench.settled([1.1] * w + [1.0] * w, 5.0)


def test_step_stats_mean_std_median_and_deciles():
    stats = bench.step_stats([s / 1e3 for s in range(1, 12)])  # 1 … 11 ms
    assert stats == pytest.approx({"": 6.0, "_std": 3.3166, "_median": 6.0, "_p10": 2.0, "_p90": 10.0}, rel=1e-4)
    assert bench.step_stats([0.005]) == {"": 5.0, "_std": 0.0, "_median": 5.0, "_p10": 5.0, "_p90": 5.0}


def test_cpu_threads_hold_for_the_config_and_are_restored():
    before = torch.get_num_threads()
    row = bench.run_config(WorkloadConfig("tiny", 8, "forward", batch_size=1, device="cpu"),
                           bench.TimingOptions(warmup=0, steps=1, cpu_threads=1, **{"max_warmup": 0}))
    assert row["status"] == "ok" and row["cpu_threads"] == 1 and torch.get_num_threads() == before


def test_repeat_interleaves_the_configs_and_resume_skips_finished_passes(monkeypatch, tmp_path):
    ran = []
    real = bench.run_config
    monkeypatch.setattr(bench, "run_config", lambda item, *a: ran.append((item.cfg.ctx, item.repeat)) or real(item, *a))
    out = tmp_path / "rows.jsonl"
    args = ["benchmark", "--model", "tiny", "--ctx", "8,16", "--mode", "forward", "--device", "cpu", "--warmup",
            "0", "--max-warmup", "0", "--steps", "2", "--output", str(out)]  # fmt: skip
    first = CliRunner().invoke(main, [*args, "--repeat", "2", "--format", "markdown"])
    assert first.exit_code == 0, first.output
    assert ran == [(8, 1), (16, 1), (8, 2), (16, 2)]
    assert "across 2 passes" in first.stdout
    ran.clear()
    again = CliRunner().invoke(main, [*args, "--repeat", "3", "--resume", "--format", "csv"])
    assert again.exit_code == 0, again.output
    assert ran == [(8, 3), (16, 3)]


def test_across_repeats_spread_of_the_medians():
    cfg = dict(model="tiny", ctx=8, mode="forward", batch_size=1, mixed_precision=False, compile=False,
               cuda_graphs=False, attention="naive", optimizer="adamw-fused", optimizer_overlap=False,
               clip_grad_norm=None, status="ok")  # fmt: skip
    rows = pd.DataFrame([{**cfg, "repeat": 1, "total_ms_median": 9.0}, {**cfg, "repeat": 2, "total_ms_median": 11.0},
                         {**cfg, "ctx": 16, "repeat": 1, "total_ms_median": 20.0}])  # fmt: skip
    summary = bench.across_repeats(rows)
    assert len(summary) == 1  # ctx 16 ran once: no spread to report
    line = summary.iloc[0]
    assert line["repeats"] == 2 and line["total_ms_median"] == 10.0 and line["repeat_spread_pct"] == pytest.approx(20)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_each_optimizer_runs_the_tiny_model_and_is_recorded(optimizer):
    master = optimizer == MASTER_WEIGHTS  # bf16 weights: it needs bf16 autocast
    cfg = WorkloadConfig("tiny", 8, "train", batch_size=1, device="cpu", optimizer=optimizer, mixed_precision=master)
    workload = Workload(cfg)
    defaults = workload.optimizer.defaults
    if master:
        assert isinstance(workload.optimizer, MasterWeightAdamW) and workload.optimizer_step == workload.optimizer.step
    else:
        assert (defaults["fused"], defaults["foreach"]) == {"adamw-fused": (True, None), "adamw-foreach": (None, True),
                                                            "adamw": (None, False)}[optimizer]  # fmt: skip
    row = bench.run_config(cfg, bench.TimingOptions(warmup=1, steps=2, max_warmup=0))
    assert row["status"] == "ok" and row["optimizer"] == optimizer and row["optimizer_ms"] > 0


def test_compile_compiles_the_optimizer_step_unless_it_is_fused():
    base = WorkloadConfig("tiny", 8, "train", batch_size=1, device="cpu", compile=True)
    fused = Workload(base)
    foreach = Workload(WorkloadConfig(**{**base.as_dict(), "optimizer": "adamw-foreach"}))
    assert fused.optimizer_step == fused.optimizer.step
    assert foreach.optimizer_step != foreach.optimizer.step and callable(foreach.optimizer_step)


def test_cuda_graphs_need_compile():
    with pytest.raises(ProfilerKitError, match="--cuda-graphs needs --compile"):
        WorkloadConfig("tiny", 8, "train", device="cpu", cuda_graphs=True).validate()
    result = CliRunner().invoke(main, ["benchmark", "--model", "tiny", "--ctx", "8", "--device", "cpu",
                                       "--cuda-graphs", "--format", "json"])
    assert result.exit_code != 0 and "--cuda-graphs needs --compile" in result.output


def test_cuda_graphs_compile_in_reduce_overhead_mode_and_begin_each_step(monkeypatch):
    """Each block compiles in reduce-overhead mode, and each step tells the CUDA graph trees that a new step
    begins, so the replay may reuse the previous step's outputs."""
    modes, marks = [], []
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, **kw: modes.append(mode) or fn)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(True))
    cfg = WorkloadConfig("tiny", 8, "train", batch_size=1, device="cpu", compile=True, cuda_graphs=True)
    workload = Workload(cfg)
    for _ in range(3):
        workload.step()
    assert modes == ["reduce-overhead"] * len(workload.model.layers) and len(marks) == 3  # each block
    row = bench.run_config(cfg, bench.TimingOptions(warmup=1, steps=2, max_warmup=0))
    assert row["status"] == "ok" and row["cuda_graphs"] is True


def test_release_resets_the_compiler_after_a_compiled_config(monkeypatch):
    """Each compiled config of a sweep compiles afresh: dynamo's caches (and CUDA graphs) go with the config."""
    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(True))
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, **kw: fn)
    for compiled in (False, True):
        release(Workload(WorkloadConfig("tiny", 8, "forward", batch_size=1, device="cpu", compile=compiled)))
    assert resets == [True]


class SpinOrSleepWorkload:
    """One phase that uses `seconds` of CPU time (`spin`: however long that takes on a loaded machine) or waits
    `seconds` (`sleep`)."""

    device = torch.device("cpu")
    phases = ("forward",)

    def __init__(self, how, seconds=SPIN_S):
        self.how, self.seconds = how, seconds

    def step(self, on_phase_end=None):
        if self.how == "sleep":
            time.sleep(self.seconds)
        else:
            end = time.process_time() + self.seconds
            while time.process_time() < end:
                pass
        if on_phase_end:
            on_phase_end("forward")


def test_host_cpu_is_the_cpu_time_of_the_step_not_of_its_final_synchronize(monkeypatch):
    """A step that computes on the host reads host_cpu ≥ the CPU time it used, one that waits reads ≈ 0, and a spinning
    synchronize after the step (as CUDA's may) adds to the wall time only."""
    def spinning_synchronize(device):
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:
            pass

    timing = bench.TimingOptions(warmup=0, steps=3, max_warmup=0)
    busy = bench.time_steps(SpinOrSleepWorkload("spin"), timing).samples
    idle = bench.time_steps(SpinOrSleepWorkload("sleep"), timing).samples
    monkeypatch.setattr(bench, "synchronize", spinning_synchronize)
    synced = bench.time_steps(SpinOrSleepWorkload("sleep"), timing).samples
    # The CPU time the spinning step used, whatever share of the wall time other processes left it.
    assert min(busy["host_cpu"]) >= SPIN_S
    assert max(idle["host_cpu"]) < 0.3 * min(idle["total"])
    assert max(synced["host_cpu"]) < 0.3 * 0.05 and min(synced["total"]) >= 0.1
