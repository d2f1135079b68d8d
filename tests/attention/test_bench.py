"""The attention benchmark on a CPU: rows, JSON contract, failures isolated, output + resume, FLOP and
saved-memory formulas, pivots and speedups, leaderboard, option errors."""

import json
import os
import time

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from profiler_kit.attention import bench
from profiler_kit.attention.bench_tables import leaderboard_table, pivot_tables, ratio_pairs
from profiler_kit.cli import main
from profiler_kit.results_io import read_rows

CPU = torch.device("cpu")
# flash-triton runs on a CPU only through Triton's interpreter, which conftest turns on where no GPU is: on a
# GPU machine these CPU tests leave it out (the gpu tests cover it there).
TRITON_ON_CPU = os.environ.get("TRITON_INTERPRET") == "1"
SWEEP_IMPLS = ["naive", "flash-torch", *(["flash-triton"] if TRITON_ON_CPU else []), "sdpa-cudnn"]
# Tiny and fast: a 1 ms budget gives do_bench's minimum of calls per measurement.
FAST = ["--device", "cpu", "--warmup", "1", "--rep", "1"]


def invoke(*args: str):
    return CliRunner().invoke(main, ["attention", *args])


@pytest.fixture(scope="module")
def sweep():
    """One real tiny sweep through the CLI: three working implementations and one that cannot run on a CPU."""
    result = invoke("bench", "--impl", ",".join(SWEEP_IMPLS), "--batch", "1",
                    "--heads", "2", "--seq", "16,32", "--d", "16", "--dtype", "fp32", "--format", "json",
                    *FAST)
    assert result.exit_code == 0, result.output
    return result


def test_json_stdout_is_pure_json_with_one_full_row_per_config(sweep):
    doc = json.loads(sweep.stdout)
    rows = doc["results"]
    assert [(r["impl"], r["seq"]) for r in rows] == [
        (impl, seq) for seq in (16, 32) for impl in SWEEP_IMPLS
    ]
    for row in rows:
        assert list(row) == list(bench.COLUMNS)
        assert (row["dtype"], row["causal"], row["batch"], row["heads"], row["d"]) == ("fp32", True, 1, 2, 16)
        assert row["device"] == "cpu"
        assert all(row[c] is None for c in bench.MEMORY_COLUMNS if c != "saved_analytic_mib")  # CUDA only


def test_failing_impl_is_an_error_row_and_the_others_still_run(sweep):
    rows = json.loads(sweep.stdout)["results"]
    for row in rows:
        if row["impl"] == "sdpa-cudnn":
            assert row["status"] == "error" and "RuntimeError" in row["message"] and row["fwd_ms"] is None
        else:
            # Only the flash kernels report the kernels and configs that ran (their launch record).
            launches = "fwd 32x16 w4 s3; dkdv 16x32 w4 s3; dq 32x16 w4 s3" if row["impl"] == "flash-triton" else ""
            assert row["status"] == "ok" and row["message"] == launches
            for timing in bench.TIMINGS:
                assert 0 < row[f"{timing}_p20_ms"] <= row[f"{timing}_ms"] <= row[f"{timing}_p80_ms"]
    assert "sdpa-cudnn fp32 seq=32 d=16: error" in sweep.stderr


def test_tflops_follow_the_paper_counting(sweep):
    for row in json.loads(sweep.stdout)["results"]:
        if row["status"] != "ok":
            continue
        n = row["seq"]
        forward_flops = 4 * 1 * 2 * n * n * 16 / 2  # 4·B·H·N²·d, halved by the causal mask
        for timing, factor in (("fwd", 1.0), ("bwd", 2.5), ("fwd_bwd", 3.5)):
            seconds = row[f"{timing}_ms"] * 1e-3
            assert row[f"{timing}_tflops"] == pytest.approx(forward_flops * factor / seconds / 1e12)


def test_pivots_hold_each_timing_per_shape_and_speedups_vs_naive(sweep):
    doc = json.loads(sweep.stdout)
    by_key = {(r["impl"], r["seq"]): r for r in doc["results"]}
    where = "(fp32, causal, B=1, H=2)"
    assert list(doc["pivots"]) == [
        title for timing in bench.TIMINGS
        for title in (f"{timing}_ms {where}", f"{timing} speedup, ref_ms / impl_ms {where}")
    ]
    ms = doc["pivots"][f"fwd_bwd_ms {where}"]
    assert [(r["seq"], r["d"]) for r in ms] == [(16, 16), (32, 16)]
    speedups = doc["pivots"][f"fwd_bwd speedup, ref_ms / impl_ms {where}"]
    for ms_row, speed_row in zip(ms, speedups, strict=True):
        naive = by_key[("naive", ms_row["seq"])]["fwd_bwd_ms"]
        assert ms_row["naive"] == naive and ms_row["sdpa-cudnn"] is None
        assert speed_row["flash-torch_vs_naive"] == pytest.approx(naive / ms_row["flash-torch"])
        assert speed_row["flash-torch_vs_sdpa-cudnn"] is None


def test_flop_counting_by_hand():
    # B·H = 6, N = 5, d = 7: 4 · 6 · 25 · 7 = 4200 forward FLOPs.
    assert bench.attention_flops(6, 5, 7, causal=False) == 4200
    assert bench.attention_flops(6, 5, 7, causal=False, timing="bwd") == 10500
    assert bench.attention_flops(6, 5, 7, causal=False, timing="fwd_bwd") == 14700
    assert bench.attention_flops(6, 5, 7, causal=True, timing="fwd_bwd") == 7350


def test_saved_bytes_by_hand():
    # B·H = 2, N = 4, d = 8, fp32: P is 2·4·4·4 = 128 B, O is 2·4·8·4 = 256 B, the causal mask 4·4 = 16 B,
    # the fp32 logsumexp 2·4·4 = 32 B.
    assert bench.saved_bytes("naive", 2, 4, 8, torch.float32, causal=True) == 128 + 256 + 16
    assert bench.saved_bytes("naive", 2, 4, 8, torch.float32, causal=False) == 128 + 256
    assert bench.saved_bytes("flash-triton", 2, 4, 8, torch.float32, causal=True) == 256 + 32
    assert bench.saved_bytes("flash-torch", 2, 4, 8, torch.bfloat16, causal=False) == 128 + 32


def _bytes_autograd_keeps(impl: str, shape: tuple, dtype: torch.dtype, causal: bool) -> int:
    """Bytes of the output plus every tensor autograd saves, inputs excluded, each storage counted once."""
    fn = bench.make_impl(impl, causal, CPU)
    q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = fn(q, k, v)
    inputs = {t.untyped_storage().data_ptr() for t in (q, k, v)}
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (*saved, out)}
    return sum(nbytes for ptr, nbytes in storages.items() if ptr not in inputs)


@pytest.mark.parametrize("impl", [
    "naive", "flash-torch", "sdpa-flash",
    pytest.param("flash-triton", marks=pytest.mark.skipif(not TRITON_ON_CPU, reason="needs Triton's interpreter")),
])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 40, 16), (2, 40, 32)])
def test_saved_bytes_match_what_autograd_keeps(impl, causal, shape):
    batch_heads = shape[0] * (shape[1] if len(shape) == 4 else 1)
    expected = bench.saved_bytes(impl, batch_heads, shape[-2], shape[-1], torch.float32, causal)
    assert _bytes_autograd_keeps(impl, shape, torch.float32, causal) == expected


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".md"])
def test_output_and_resume_skip_finished_rows(tmp_path, suffix):
    out = tmp_path / f"attention{suffix}"
    args = ["--impl", "naive", "--batch", "1", "--d", "16", "--dtype", "fp32", "--output", str(out), *FAST]
    first = invoke("bench", "--seq", "32", *args, "--format", "csv")
    assert first.exit_code == 0, first.output
    assert [r["seq"] for r in read_rows(out)] == [32]
    second = invoke("bench", "--seq", "32,48", "--resume", *args, "--format", "json")
    assert second.exit_code == 0, second.output
    assert "resume: 1 of 2 configs already in" in second.stderr
    assert [r["seq"] for r in read_rows(out)] == [32, 48]  # only the missing config was run and appended
    shown = json.loads(second.stdout)["results"]
    assert [(r["seq"], r["heads"], r["status"]) for r in shown] == [(32, None, "ok"), (48, None, "ok")]


@pytest.mark.parametrize("suffix", [".jsonl", ".md"])
def test_resume_reruns_a_config_measured_with_another_warmup_or_rep(tmp_path, suffix):
    out = tmp_path / f"attention{suffix}"
    args = ["bench", "--impl", "naive", "--batch", "1", "--seq", "32", "--d", "16", "--dtype", "fp32",
            "--device", "cpu", "--output", str(out), "--resume", "--format", "csv"]

    def rows_after(warmup: str, rep: str) -> list[dict]:
        result = invoke(*args, "--warmup", warmup, "--rep", rep)
        assert result.exit_code == 0, result.output
        return read_rows(out)

    assert len(rows_after("1", "1")) == len(rows_after("1", "1")) == 1  # the same settings again: skipped
    assert [(r["warmup_ms"], r["rep_ms"]) for r in rows_after("2", "1")] == [(1, 1), (2, 1)]
    assert [(r["warmup_ms"], r["rep_ms"]) for r in rows_after("1", "2")] == [(1, 1), (2, 1), (1, 2)]
    assert len(rows_after("1", "2")) == 3


def test_leaderboard_ranks_by_fwd_bwd_with_ratio_columns():
    result = invoke("leaderboard", "--impl", "flash-torch,sdpa-flash,sdpa-cudnn", "--heads", "2",
                    "--seq", "32", "--d", "16", "--dtype", "fp32", "--format", "json", *FAST)
    assert result.exit_code == 0, result.output
    board = json.loads(result.stdout)["leaderboard"]
    assert [r["status"] for r in board] == ["ok", "ok", "error"] and board[2]["impl"] == "sdpa-cudnn"
    assert board[0]["fwd_bwd_ms"] <= board[1]["fwd_bwd_ms"]
    flash_ms = {r["impl"]: r["fwd_bwd_ms"] for r in board}["sdpa-flash"]
    for row in board[:2]:
        assert row["fwd_bwd_vs_sdpa-flash"] == pytest.approx(flash_ms / row["fwd_bwd_ms"])
        assert row["fwd_bwd_vs_sdpa-cudnn"] is None


def test_leaderboard_with_the_backward_on_the_calling_thread(tmp_path):
    out = tmp_path / "caller.jsonl"
    result = invoke("leaderboard", "--impl", "flash-torch,sdpa-flash", "--heads", "2", "--seq", "32", "--d", "16",
                    "--dtype", "fp32", "--backward-on-caller", "--output", str(out), "--format", "markdown", *FAST)
    assert result.exit_code == 0, result.output
    assert "backward on the calling thread" in result.stdout
    assert [(r["impl"], r["status"], r["backward_thread"]) for r in read_rows(out)] == [
        ("flash-torch", "ok", "caller"), ("sdpa-flash", "ok", "caller")]


def test_ratio_pairs_name_each_pair_once():
    impls = ["naive", "sdpa-flash", "sdpa-cudnn", "flash-triton"]
    assert ratio_pairs(impls) == [
        ("sdpa-flash", "naive"), ("sdpa-cudnn", "naive"), ("flash-triton", "naive"),
        ("sdpa-flash", "sdpa-cudnn"), ("flash-triton", "sdpa-cudnn"),
        ("flash-triton", "sdpa-flash"),
    ]
    assert ratio_pairs(["flash-torch", "flash-triton"]) == []


def test_pivots_and_leaderboard_keep_the_last_row_of_a_repeated_config():
    row = dict.fromkeys(bench.COLUMNS) | {"impl": "naive", "dtype": "bf16", "causal": False, "batch": 1,
                                         "heads": None, "seq": 64, "d": 32, "status": "ok"}
    rows = [row | {"fwd_bwd_ms": 9.0}, row | {"fwd_bwd_ms": 3.0}]
    results = pd.DataFrame(rows, columns=list(bench.COLUMNS))
    tables = dict(pivot_tables(results))
    where = "(bf16, non-causal, B=1, no heads)"
    assert list(tables) == [f"{t}_ms {where}" for t in bench.TIMINGS]  # one impl: no speedup tables
    fwd_bwd = tables[f"fwd_bwd_ms {where}"]
    assert fwd_bwd["naive"].tolist() == [3.0]
    assert leaderboard_table(results)["fwd_bwd_ms"].tolist() == [3.0]


def test_clock_fallback_statistics_and_grad_reset():
    x = torch.ones(3, requires_grad=True)

    def step():
        time.sleep(0.002)
        (2 * x).sum().backward()

    timing = bench.bench_ms(step, CPU, warmup_ms=1, rep_ms=20, grad_to_none=[x])
    assert 2.0 <= timing.p20_ms <= timing.median_ms <= timing.p80_ms
    assert x.grad.tolist() == [2.0, 2.0, 2.0]  # reset before each call: no accumulation


def cpu_config(impl: str, seq: int = 32) -> bench.AttentionConfig:
    return bench.AttentionConfig(impl, "fp32", True, 1, 2, seq, 16, device="cpu")


def test_rounds_alternate_the_order_and_split_the_budget(monkeypatch):
    order, budgets = [], []
    real = bench._time_round

    def logged(fn, inputs, samples, device, warmup_ms, rep_ms, backward_on_caller):
        order.append(fn.impl_name)
        budgets.append(rep_ms)
        real(fn, inputs, samples, device, warmup_ms, rep_ms, backward_on_caller)

    real_make = bench.make_impl

    def named(name, causal, device):
        fn = real_make(name, causal, device)
        wrapper = lambda q, k, v: fn(q, k, v)  # noqa: E731
        wrapper.impl_name = name
        return wrapper

    monkeypatch.setattr(bench, "_time_round", logged)
    monkeypatch.setattr(bench, "make_impl", named)
    rows = bench.run_shape([cpu_config("naive"), cpu_config("flash-torch")], warmup_ms=1, rep_ms=6, rounds=3)
    assert order == ["naive", "flash-torch", "flash-torch", "naive", "naive", "flash-torch"]
    assert budgets == [2.0] * 6
    for row in rows:
        assert row["status"] == "ok" and row["rounds"] == 3
        for timing in bench.TIMINGS:
            assert 0 < row[f"{timing}_p20_ms"] <= row[f"{timing}_ms"] <= row[f"{timing}_p80_ms"]


@pytest.mark.parametrize("on_caller", [False, True])
def test_backward_on_caller_switches_the_engine_threads_off_for_the_backward_timings(monkeypatch, on_caller):
    """`backward_on_caller` runs the timed backward passes with the autograd engine's device threads off
    (`torch.autograd.set_multithreading_enabled(False)`), and only them; the row says which."""
    seen = []
    real_sample = bench.sample_ms

    def recording(fn, *args, **kwargs):
        seen.append(torch.autograd.is_multithreading_enabled())
        return real_sample(fn, *args, **kwargs)

    monkeypatch.setattr(bench, "sample_ms", recording)
    row, = bench.run_shape([cpu_config("naive")], warmup_ms=1, rep_ms=2, backward_on_caller=on_caller)
    assert row["status"] == "ok" and row["backward_thread"] == ("caller" if on_caller else "engine")
    assert seen == [True, not on_caller, not on_caller]  # fwd, bwd, fwd+bwd
    assert torch.autograd.is_multithreading_enabled()


def test_rounds_pool_every_call(monkeypatch):
    readings = iter([[1.0, 1.0, 1.0], [5.0], [5.0], [3.0, 3.0, 3.0], [5.0], [5.0]])
    monkeypatch.setattr(bench, "sample_ms", lambda *args, **kwargs: next(readings))
    row, = bench.run_shape([cpu_config("naive")], warmup_ms=1, rep_ms=2, rounds=2)
    # Six forward calls, 1 1 1 3 3 3: the median interpolates between the third and fourth.
    assert (row["fwd_ms"], row["fwd_p20_ms"], row["fwd_p80_ms"]) == pytest.approx((2.0, 1.0, 3.0))
    assert row["bwd_ms"] == row["fwd_bwd_ms"] == 5.0


def test_a_failure_in_a_later_round_keeps_the_earlier_rounds_and_the_other_impl(monkeypatch):
    real_make = bench.make_impl
    calls = 0

    def breaks_later(name, causal, device):
        fn = real_make(name, causal, device)
        if name != "flash-torch":
            return fn

        def counted(q, k, v):
            nonlocal calls
            calls += 1
            if calls > 25:
                raise torch.cuda.OutOfMemoryError("out of memory (on purpose)")
            return fn(q, k, v)

        return counted

    monkeypatch.setattr(bench, "make_impl", breaks_later)
    monkeypatch.setattr(bench, "sample_ms", lambda fn, *args: [(fn(), 1.0)[1] for _ in range(10)])
    ok, broken = bench.run_shape([cpu_config("naive"), cpu_config("flash-torch")], 1, 10, rounds=3)
    assert ok["status"] == "ok" and ok["fwd_bwd_ms"] == 1.0
    assert broken["status"] == "oom" and "on purpose" in broken["message"]
    # The warm-up call and round 1's 10 + 1 + 10 forward calls pass; round 2 fails in its forward.
    assert broken["fwd_ms"] == broken["bwd_ms"] == broken["fwd_bwd_ms"] == 1.0


def test_run_shape_refuses_two_shapes():
    with pytest.raises(ValueError, match="differ only in their implementation"):
        bench.run_shape([cpu_config("naive", 32), cpu_config("flash-torch", 48)], 1, 1)


def test_shape_groups_keep_the_order():
    cfgs = [cpu_config(impl, seq) for seq in (32, 48) for impl in ("naive", "flash-torch")]
    assert bench.shape_groups(cfgs, together=False) == [[c] for c in cfgs]
    assert bench.shape_groups(cfgs, together=True) == [cfgs[:2], cfgs[2:]]


def test_bench_with_rounds_through_the_cli(tmp_path):
    out = tmp_path / "rounds.jsonl"
    result = invoke("bench", "--impl", "naive,flash-torch,sdpa-cudnn", "--batch", "1", "--seq", "16,32",
                    "--d", "16", "--dtype", "fp32", "--rounds", "2", "--output", str(out), *FAST)
    assert result.exit_code == 0, result.output
    assert "2 interleaved rounds per shape" in " ".join(result.stdout.split())  # the caption wraps with the terminal
    rows = read_rows(out)
    assert {r["backward_thread"] for r in rows} == {"engine"}
    assert [(r["impl"], r["seq"], r["status"], r["rounds"]) for r in rows] == [
        (impl, seq, "error" if impl == "sdpa-cudnn" else "ok", 2)
        for seq in (16, 32) for impl in ("naive", "flash-torch", "sdpa-cudnn")
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "--seq", "0"], "'0' must be positive"),
        (["bench", "--impl", "naive,magic"], "'magic': choose from naive, compiled"),
        (["bench", "--dtype", "fp8"], "'fp8': choose from fp32, bf16, fp16"),
        (["bench", "--resume"], "--resume needs --output"),
        (["leaderboard", "--rounds", "0"], "'0' must be positive"),
        (["leaderboard", "--dtype", "fp32,bf16"], "takes one value here"),
    ],
)
def test_bad_options_are_usage_errors(args, message):
    result = invoke(*args, "--device", "cpu")
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output


def test_a_sweep_where_nothing_runs_exits_non_zero():
    result = invoke("bench", "--impl", "sdpa-cudnn", "--seq", "32", "--d", "16", "--dtype", "fp32",
                    "--format", "json", *FAST)
    assert result.exit_code == 1 and "no config ran" in result.stderr
    assert json.loads(result.stdout)["results"][0]["status"] == "error"


# ------------------------------------------------------------------------------------------------ GPU only
GPU_SHAPE = {"batch": 2, "heads": 4, "seq": 1024, "d": 64}


def gpu_config(impl: str, dtype: str = "bf16", **shape) -> bench.AttentionConfig:
    return bench.AttentionConfig(impl, dtype, True, **(GPU_SHAPE | shape), device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["naive", pytest.param("flash-triton", marks=pytest.mark.gpu_slow), "sdpa-flash",
                                  "sdpa-cudnn", "sdpa-efficient"])  # flash-triton autotunes
def test_gpu_measured_saved_memory_matches_the_analytic_size(impl):
    row = bench.run_config(gpu_config(impl), 5, 20)
    assert row["status"] == "ok", row["message"]
    # SDPA backends also keep RNG seed/offset tensors: a few 512-byte allocator blocks.
    assert row["saved_mib"] == pytest.approx(row["saved_analytic_mib"], rel=0.01)
    assert row["mem_inputs_mib"] < row["mem_before_bwd_mib"] <= row["fwd_peak_mib"]
    assert row["mem_inputs_mib"] < row["bwd_peak_mib"]
    for timing in bench.TIMINGS:
        assert 0 < row[f"{timing}_p20_ms"] <= row[f"{timing}_ms"] <= row[f"{timing}_p80_ms"]
    if impl == "flash-triton":  # the row names the configs the autotuner ran, e.g. "fwd 128x64 w8 s3; dkdv …"
        assert [part.split()[0] for part in row["message"].split("; ")] == ["fwd", "dkdv", "dq"], row["message"]


@pytest.mark.gpu
@pytest.mark.gpu_slow  # flash-triton autotunes
def test_gpu_rounds_share_the_inputs_and_give_all_memory_back():
    torch.cuda.empty_cache()
    before, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    rows = bench.run_shape([gpu_config(impl) for impl in ("flash-triton", "sdpa-flash", "sdpa-cudnn")], 5, 30,
                           rounds=3)
    assert [(row["status"], row["rounds"]) for row in rows] == [("ok", 3)] * 3, [r["message"] for r in rows]
    assert len({row["mem_inputs_mib"] for row in rows}) == 1  # one set of inputs, measured alike for each
    for row in rows:
        assert row["saved_mib"] == pytest.approx(row["saved_analytic_mib"], rel=0.01)
        for timing in bench.TIMINGS:
            assert 0 < row[f"{timing}_p20_ms"] <= row[f"{timing}_ms"] <= row[f"{timing}_p80_ms"]
    # Nothing stays allocated, and nothing stays cached: the inputs were dropped before the cache was emptied.
    assert (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) == (before, reserved)


@pytest.mark.gpu
def test_gpu_unsupported_backend_reports_torchs_reason():
    row = bench.run_config(gpu_config("sdpa-flash", "fp32"), 5, 20)
    assert row["status"] == "error" and "dtype" in row["message"]


@pytest.mark.gpu
def test_gpu_oom_is_a_row_and_its_memory_is_given_back():
    assert bench.run_config(gpu_config("naive"), 5, 20)["status"] == "ok"  # cuBLAS workspaces now exist
    before = torch.cuda.memory_allocated()
    # The N×N probabilities alone would need 16·16·65536²·2 bytes ≈ 2.2 TB.
    row = bench.run_config(gpu_config("naive", batch=16, heads=16, seq=65536), 5, 20)
    assert row["status"] == "oom" and row["fwd_ms"] is None
    assert torch.cuda.memory_allocated() == before
    assert bench.run_config(gpu_config("naive"), 5, 20)["status"] == "ok"


@pytest.mark.gpu
@pytest.mark.gpu_slow  # torch.compile
def test_compiled_backward_can_be_replayed_for_timing():
    """The backward-alone timing replays one graph with retain_graph=True; the compiled impl must allow it
    (on CUDA, AOTAutograd donates the backward's buffers unless told not to)."""
    import torch

    from profiler_kit.attention.bench import make_impl

    fn = make_impl("compiled", causal=True, device=torch.device("cuda"))
    q, k, v = (torch.randn(2, 256, 64, device="cuda", requires_grad=True) for _ in range(3))
    out = fn(q, k, v)
    grad = torch.randn_like(out)
    out.backward(grad, retain_graph=True)
    first = q.grad.clone()
    q.grad = None
    out.backward(grad, retain_graph=True)
    torch.testing.assert_close(q.grad, first)
