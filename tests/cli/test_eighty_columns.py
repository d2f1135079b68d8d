"""At 80 columns the output keeps its meaning: every `--help` fits; the summary, per-rank, memory and compare
tables fit with their key columns; constant columns go first and say their value; headers break after an
underscore before a key column goes; titles wrap at the terminal's width; names that read alike once cut keep
what tells them apart; evidence is cut at a word (whole in JSON)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.render import shorten_distinct

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "tests" / "fixtures" / "kernels"
SMALL = REPO / "profiles" / "examples" / "small_ctx128_train_bf16.sqlite"
SNAPSHOT = REPO / "memory_snapshots" / "examples" / "plain_adamw_fused.pickle"
BOX_HEADER = "┃"


def _cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args], env={"COLUMNS": "80"})


def _command_paths(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [path]
    for name in group.list_commands(click.Context(group)):
        command = group.get_command(click.Context(group), name)
        paths += _command_paths(command, (*path, name)) if isinstance(command, click.Group) else [(*path, name)]
    return paths


@pytest.mark.parametrize("path", _command_paths(main), ids=lambda p: " ".join(p) or "profiler-kit")
def test_every_help_fits_80_columns(path):
    result = _cli(*path, "--help")
    assert result.exit_code == 0, result.output
    long = [line for line in result.stdout.splitlines() if len(line) > 80]
    assert not long, long


def _tables(text: str) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Each boxed table of `text` by the first line of its title: its headers (a header on several lines joined
    again) and its rows."""
    tables: dict[str, tuple[list[str], list[list[str]]]] = {}
    lines = text.splitlines()
    title = None
    for i, line in enumerate(lines):
        if line.startswith("┏"):
            start = i - 1
            while start > 0 and not lines[start - 1].startswith(("└", "not shown", "  ")) and lines[start - 1]:
                start -= 1
            title = lines[start]
            tables[title] = ([], [])
        elif line.startswith(BOX_HEADER) and title is not None:
            cells = [c.strip() for c in line.split(BOX_HEADER)[1:-1]]
            headers = tables[title][0]
            tables[title] = ([a + b for a, b in zip(headers, cells, strict=True)] if headers else cells, [])
        elif line.startswith("│") and title is not None:
            tables[title][1].append([c.strip() for c in line.split("│")[1:-1]])
    return tables


def _table(text: str, start: str) -> tuple[list[str], list[list[str]]]:
    return next(table for title, table in _tables(text).items() if title.startswith(start))


def _fits(result) -> str:
    assert result.exit_code == 0, result.output
    assert max(map(len, result.stdout.splitlines())) <= 80
    return result.stdout


def test_the_summary_keeps_names_times_and_shares():
    out = _fits(_cli("kernels", "summarize", SMALL))
    assert _table(out, "Kernel time by category")[0] == ["category", "kernels", "total_ms", "share_pct"]
    headers, rows = _table(out, "Top 10 kernels")
    assert headers[:2] == ["name", "category"] and {"total_ms", "share_pct"} <= set(headers)
    assert len({row[0] for row in rows}) == len(rows)  # ten different kernels read as ten names
    assert {"phase", "total_ms", "share_pct"} <= set(_table(out, "Per phase")[0])


@pytest.mark.parametrize("reports", [[KERNELS / "gpu2_ddp_nccl.sqlite"],
                                     sorted(KERNELS.glob("cpu_ddp2_gloo.rank*.json.gz"))], ids=["nccl", "gloo"])
def test_the_per_rank_table_keeps_rank_time_and_communication(reports):
    out = _fits(_cli("kernels", "summarize", *reports))
    headers, rows = _table(out, "Per rank")
    assert headers[0] == "rank" and {"wall_ms", "busy_step_ms", "total_ms"} <= set(headers)
    # The communication columns, unless the same in every row (the note under the table says so).
    kept = {"collective_calls", "comm_ms", "exposed_comm_ms", "times_last", "waited_ms"} - set(headers)
    assert all(re.search(rf"{column} \(\S+ in every row\)", " ".join(out.split())) for column in kept), kept
    assert "node" not in headers and [row[0] for row in rows] == ["0", "1"]
    if json.loads(_cli("kernels", "summarize", *reports, "--format", "json").stdout)["ranks"][0]["node"] is not None:
        assert "node (0 in every row)" in " ".join(out.split())  # the job's one node, said in a word


def test_the_memory_tables_keep_size_role_and_evidence_cut_at_a_word():
    out = _fits(_cli("memory", "summarize", SNAPSHOT, "--top", "5"))
    doc = json.loads(_cli("memory", "summarize", SNAPSHOT, "--top", "5", "--format", "json").stdout)
    headers, rows = _table(out, "largest 5 allocations")
    assert headers[:4] == ["#", "size_mib", "role", "evidence"] and [row[0] for row in rows] == list("12345")
    assert [a["position"] for a in doc["top_allocations"]] == [1, 2, 3, 4, 5]
    headers, rows = _table(out, "allocated at the peak by role")
    assert headers[0] == "role" and {"size_mib", "share_pct", "evidence"} <= set(headers)
    full = {r["role"]: r["evidence"] for r in doc["roles_at_peak"]}
    at = headers.index("evidence")
    cut = [(row[at], full[row[0]]) for row in rows if row[at].endswith("…")]
    assert cut
    for cell, whole in cut:
        kept = cell.removesuffix("…")
        assert whole.startswith(kept) and whole[len(kept.rstrip(",;:"))] in " ,;:", (cell, whole)


def test_the_compare_tables_keep_their_deltas():
    out = _fits(_cli("kernels", "compare", KERNELS / "h100_tiny_train_fp32.sqlite",
                     KERNELS / "h100_tiny_train_bf16.sqlite"))
    assert {"category", "a_ms", "b_ms", "delta_ms", "speedup"} <= set(_table(out, "Time by category")[0])
    headers, rows = _table(out, "Kernels that moved most")
    assert headers[0] == "kernel" and {"delta_ms", "speedup"} <= set(headers)
    assert len({row[0] for row in rows}) == len(rows)


def test_a_title_wraps_at_the_terminal_width_not_the_table_s():
    from profiler_kit.kernels import summarize

    out = _fits(_cli("kernels", "summarize", KERNELS / "cpu_example_mlp_torch.json.gz"))
    title = summarize(KERNELS / "cpu_example_mlp_torch.json.gz").tables(display=True)[0][0]
    lines = out.splitlines()
    box = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    assert lines[:box] == textwrap.wrap(title, 80, break_on_hyphens=False)
    assert len(lines[0]) > len(lines[box])  # wider than its table


def test_names_that_read_alike_once_cut_keep_what_tells_them_apart():
    names = ["multi_tensor_apply_kernel<TensorListMetadata<1>, BinaryOpScalarFunctor<float, 1, 1, 0>, "
             "std::multiplies<float>, float>",
             "multi_tensor_apply_kernel<TensorListMetadata<3>, PointwiseOpScalarFunctor<float, 3, 3, 0>, "
             "std::multiplies<float>, float>",
             "multi_tensor_apply_kernel<TensorListMetadata<2>, TernaryOpScalarFunctor<float, 2, 2, 0>, "
             "LerpFunctor<float>, float>",
             "elementwise_kernel<float>"]
    for width in (24, 39, 60):
        cut = shorten_distinct(names, width)
        assert len(set(cut)) == len(names) and all(len(c) <= width for c in cut), cut
        assert all(c.startswith(n[:width // 3 - 1]) for c, n in zip(cut, names, strict=True))
    assert shorten_distinct(names, 39)[3] == "elementwise_kernel<float>"  # short enough: whole
