"""On a GPU: the module marks of an unannotated program under nsys and torch.profiler. Eager, each module's
backward range runs on the autograd engine's device thread, not the thread of its forward; the FLOPs of the first
step count the attention's flash kernels; compiled whole (`torch.compile(model)`, `model.compile()`) the model
gets one `forward` per call and no module range, compiled block by block one range per block call."""

from __future__ import annotations

import gzip
import json
import sqlite3
import sys
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_slow]
B, T, D, HEADS = 8, 256, 512, 8
PROGRAM = f"""
import sys, torch
from torch import nn
import torch.nn.functional as F

class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear({D}, 3 * {D}), nn.Linear({D}, {D})

    def forward(self, x):
        q, k, v = self.qkv(x).view({B}, {T}, 3, {HEADS}, {D // HEADS}).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape({B}, {T}, {D}))

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.attn = nn.LayerNorm({D}), Attention()

    def forward(self, x):
        return x + self.attn(self.norm(x))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x

model = Net().cuda().to(torch.bfloat16)
how = sys.argv[1]
if how == "whole":
    model = torch.compile(model)
elif how == "in-place":
    model.compile()
elif how == "blocks":
    for block in model.blocks:
        block.compile()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(4):
    model(torch.randn({B}, {T}, {D}, device="cuda", dtype=torch.bfloat16)).float().square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


def record(tmp_path: Path, how: str, *options: str) -> Path:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    out = tmp_path / how
    result = CliRunner().invoke(main, ["nsys", *options, "--no-capture", "-o", str(out), "--format", "json",
                                       "--", sys.executable, str(script), how])
    assert result.exit_code == 0, result.output
    return out


def nsys_ranges(export: Path) -> tuple[list[tuple[str, str, int]], dict]:
    """(category, name, thread) of every start/end range of the profiler_kit domain, and the latest modules
    metadata mark (one process)."""
    with sqlite3.connect(export) as con:
        kinds = dict(con.execute("SELECT name, id FROM ENUM_NSYS_EVENT_TYPE").fetchall())
        rows = con.execute("SELECT n.eventType, n.category, coalesce(n.text, s.value), n.globalTid "
                           "FROM NVTX_EVENTS AS n LEFT JOIN StringIds AS s ON s.id = n.textId "
                           "ORDER BY n.start").fetchall()
    categories = {category: text for kind, category, text, _ in rows if kind == kinds["NvtxCategory"]}
    ranges = [(categories.get(category), text, tid) for kind, category, text, tid in rows
              if kind == kinds["NvtxStartEndRange"]]
    marks = [text for kind, category, text, _ in rows
             if kind == kinds["NvtxMark"] and categories.get(category) == "modules"]
    return ranges, json.loads(marks[-1])


def test_eager_module_backward_runs_on_the_autograd_thread_and_flash_flops_count(tmp_path, gpu_nsys):
    ranges, meta = nsys_ranges(record(tmp_path, "eager", "--nsys", str(gpu_nsys.path), "--modules", "all")
                               .with_suffix(".sqlite"))
    forward = {tid for category, _, tid in ranges if category == "module"}
    backward = {tid for category, _, tid in ranges if category == "module_backward"}
    assert len(forward) == 1 and backward and not backward & forward
    count = Counter((category, name) for category, name, _ in ranges if category and category.startswith("module"))
    for path in ("blocks.0", "blocks.1.attn", "blocks.1.attn.qkv"):
        assert count["module", path] == count["module_backward", path] == 4, path
    flops = meta["flops"]["modules"]
    linear = 2 * B * T * D * 3 * D
    assert flops["blocks.0.attn.qkv"]["forward"] == linear
    # The attention's flash kernels: 4·B·H·T²·d forward (FlopCounterMode's formula, causal or not).
    attention = flops["blocks.0.attn"]["forward"] - linear - 2 * B * T * D * D
    assert attention == 4 * B * HEADS * T * T * (D // HEADS)
    # The torch.profiler trace: the same FLOPs, backward ranges on their own thread.
    out = record(tmp_path, "eager-torch", "--backend", "torch", "--modules", "all")
    with gzip.open(out.with_name(out.name + ".json.gz"), "rt") as fh:
        trace = json.load(fh)
    assert trace["profiler_kit"]["modules"]["flops"] == meta["flops"]
    # The CPU side's ranges (kineto also copies each range onto the GPU streams it launched on, as
    # gpu_user_annotation events whose tid is the stream).
    threads = {kind: {e["tid"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"
                      and e.get("name", "").startswith(f"profiler_kit::{kind}::")}
               for kind in ("module", "module_backward")}
    assert threads["module_backward"] and not threads["module_backward"] & threads["module"]


@pytest.mark.parametrize("how", ["whole", "in-place", "blocks"])
def test_a_compiled_model_gets_one_forward_per_call(tmp_path, gpu_nsys, how):
    ranges, meta = nsys_ranges(record(tmp_path, how, "--nsys", str(gpu_nsys.path), "--modules", "depth:3")
                               .with_suffix(".sqlite"))
    count = Counter((category, name) for category, name, _ in ranges)
    assert count["auto", "forward"] == 4 and count["auto", "backward"] == 4
    modules = {key: n for key, n in count.items() if key[0] and key[0].startswith("module")}
    if how == "blocks":
        assert modules == {(kind, f"blocks.{i}"): 4 for kind in ("module", "module_backward") for i in (0, 1)}
        assert meta["compiled"] == ["blocks.0", "blocks.1"]
    else:
        assert modules == {} and meta["compiled"] == [""]
