"""`profiler-kit models` and `profiler-kit precision`: their tables, through the command line."""

from __future__ import annotations

import json

from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.presets import PRESETS, count_parameters


def run(*args: str) -> dict:
    result = CliRunner().invoke(main, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["schema_version"] >= 1 and "environment" in document
    return document


def test_models_lists_every_preset_with_its_exact_count():
    rows = run("models")["model_presets"]
    assert [r["model"] for r in rows] == list(PRESETS)
    for row in rows:
        cfg = PRESETS[row["model"]]
        assert row["params"] == count_parameters(cfg)
        assert row["params"] - row["non_embedding_params"] == 2 * cfg.vocab_size * cfg.d_model
        assert row["head_dim"] * row["heads"] == row["d_model"]


def test_models_as_markdown_has_a_row_per_preset():
    result = CliRunner().invoke(main, ["models", "--format", "markdown"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("| model | d_model |") and len(lines) == 2 + len(PRESETS)


def test_precision_shows_fp16_accumulation_stalling_and_autocast_dtypes():
    tables = run("precision", "--device", "cpu")
    sums, dtypes = tables["accumulation"], tables["autocast_dtypes"]
    error = {r["case"]: r["abs_error"] for r in sums}
    assert error["fp16 += fp16"] > 10 * error["fp32 += fp16.to(fp32) (explicit cast)"] > 0
    assert error["fp32 += fp32"] < error["fp32 += fp16.to(fp32) (explicit cast)"]
    by_tensor = {r["tensor"]: r["dtype"] for r in dtypes}
    assert by_tensor["parameters (fc1.weight)"] == "float32"
    assert by_tensor["fc1 (linear) output"] == "bfloat16"
    assert {r["device"] for r in dtypes} == {"cpu"}
