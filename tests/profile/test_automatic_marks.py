"""The recorder's automatic marks on programs that know nothing of profiler-kit (torch.profiler on the CPU): a loop
with gradient accumulation and clipping, activation checkpointing, an inference loop, a Hugging Face-style model
taking a dict batch, a `torch.compile`d model; and the phase rule over them: a program's own `record_function`
ranges win over the marks, `profiler_kit.phase` over everything."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import load

MODEL = """
import json, sys, torch
from torch import nn
from torch.utils.checkpoint import checkpoint
torch.manual_seed(0)

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))

class Net(nn.Module):
    def __init__(self, checkpointed=False):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.checkpointed = checkpointed

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            if self.checkpointed and i % 2:
                x = checkpoint(block, x, use_reentrant=i == 1)
            else:
                x = block(x)
        return x

def batch():
    return torch.randn(2048, 64)
"""


def profile(tmp_path: Path, body: str, *options: str) -> tuple[object, dict, pd.DataFrame]:
    """Run a program (MODEL, then `body`) under `profiler-kit nsys --backend torch`: the CLI result, its JSON
    summary, and the trace's ranges as the reader sees them."""
    script = tmp_path / "prog.py"
    script.write_text(MODEL + textwrap.dedent(body))
    out = tmp_path / "prog"
    result = CliRunner().invoke(main, ["nsys", "--backend", "torch", "-o", str(out), "--force", "--format", "json",
                                       *options, "--", sys.executable, str(script)])
    assert result.exit_code == 0, result.stderr
    return result, json.loads(result.stdout), load(out.with_name("prog.json.gz")).ranges


def marks(ranges: pd.DataFrame) -> pd.Series:
    """How many automatic marks of each name the trace holds (not the module marks, `<category>::<path>`)."""
    auto = ranges[(ranges["kind"] == "auto") & ~ranges["name"].str.contains("::", regex=False)]
    return auto.groupby("name").size()


def test_gradient_accumulation_and_clipping(tmp_path):
    result, doc, ranges = profile(tmp_path, """
        model = Net()
        opt = torch.optim.AdamW(model.parameters())
        for step in range(4):
            for micro in range(2):
                (model(batch()).square().mean() / 2).backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        print("done")
    """)
    assert "done" in result.stderr and "recorded the whole run, 4 steps" in result.stderr
    assert doc["phase_rule"] == "auto" and list(doc["phases"]) == ["forward", "backward", "optimizer_step"]
    assert len(doc["steps"]) == 4
    in_phases = sum(phase["total_ns"] for phase in doc["phases"].values())
    # Outside the phases lie the clipping and zero_grad: a few operators whose cost does not grow with the batch.
    assert in_phases >= 0.9 * doc["total_ns"], in_phases / doc["total_ns"]
    assert marks(ranges).to_dict() == {"backward": 8, "forward": 8, "optimizer_step": 4, "step": 4}
    steps = ranges[(ranges["kind"] == "auto") & (ranges["name"] == "step")]
    assert steps["number"].tolist() == [0, 1, 2, 3]
    # A step holds its micro-batches and ends with the optimizer step.
    opt = ranges[(ranges["kind"] == "auto") & (ranges["name"] == "optimizer_step")]
    assert (opt["end_ns"].to_numpy() <= steps["end_ns"].to_numpy()).all()


def test_activation_checkpointing_recomputes_inside_backward(tmp_path):
    _, doc, ranges = profile(tmp_path, """
        model = Net(checkpointed=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            model(batch().requires_grad_()).sum().backward()
            opt.step()
            opt.zero_grad()
    """)
    # The recomputed blocks (reentrant and not) run their modules again inside backward: no new forward.
    assert marks(ranges).to_dict() == {"backward": 3, "forward": 3, "optimizer_step": 3, "step": 3}
    assert len(doc["steps"]) == 3 and doc["phase_rule"] == "auto"


def test_an_inference_loop_has_a_step_per_forward(tmp_path):
    result, doc, ranges = profile(tmp_path, """
        model = Net().eval()
        with torch.no_grad():
            for _ in range(5):
                model(batch())
    """)
    assert marks(ranges).to_dict() == {"forward": 5, "step": 5}
    assert list(doc["phases"]) == ["forward"] and len(doc["steps"]) == 5
    assert "recorded the whole run, 5 steps" in result.stderr


def test_a_hugging_face_style_model_with_a_dict_batch(tmp_path):
    _, doc, ranges = profile(tmp_path, """
        class LM(nn.Module):
            # Takes the batch as keyword arguments and returns a dict holding the loss, as transformers' do.
            def __init__(self):
                super().__init__()
                self.embed, self.body, self.head = nn.Embedding(50, 64), Net(), nn.Linear(64, 50)

            def forward(self, input_ids, labels=None, attention_mask=None):
                logits = self.head(self.body(self.embed(input_ids)))
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
                return {"loss": loss, "logits": logits}

        model = LM()
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(3):
            ids = torch.randint(0, 50, (4, 8))
            batch = {"input_ids": ids, "labels": ids, "attention_mask": torch.ones_like(ids)}
            out = model(**batch)
            out["loss"].backward()
            opt.step()
            opt.zero_grad()
    """)
    assert marks(ranges).to_dict() == {"backward": 3, "forward": 3, "optimizer_step": 3, "step": 3}
    assert list(doc["phases"]) == ["forward", "backward", "optimizer_step"] and len(doc["steps"]) == 3


def test_a_compiled_model_keeps_its_graph_and_its_marks(tmp_path):
    result, doc, ranges = profile(tmp_path, """
        import torch._dynamo.utils
        model = torch.compile(Net())
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(3):
            model(batch()).square().mean().backward()
            opt.step()
            opt.zero_grad()
        print("graph breaks", json.dumps(dict(torch._dynamo.utils.counters["graph_break"])))
    """)
    assert "graph breaks {}" in result.stderr
    assert "global hooks" not in result.stderr  # torch's warning about the marks' hooks is the recorder's, kept away
    assert marks(ranges).to_dict() == {"backward": 3, "forward": 3, "optimizer_step": 3, "step": 3}
    assert len(doc["steps"]) == 3


RECORD_FUNCTIONS = """
    model = Net()
    opt = torch.optim.AdamW(model.parameters())

    @torch.autograd.profiler.record_function("opt")
    def update():
        opt.step()
        opt.zero_grad()

    for _ in range(3):
        with torch.profiler.record_function("fwd"):
            loss = model(batch()).square().mean()
        with torch.profiler.record_function("bwd"):
            loss.backward()
        update()
"""


def test_the_programs_own_record_function_ranges_win_over_the_marks(tmp_path):
    _, doc, ranges = profile(tmp_path, RECORD_FUNCTIONS)
    assert doc["phase_rule"] == "program" and list(doc["phases"]) == ["fwd", "bwd", "opt"]
    assert len(doc["steps"]) == 3  # the recorder's steps, still
    own = ranges[ranges["kind"] == "program"].groupby("name").size()
    assert own["fwd"] == own["bwd"] == own["opt"] == 3


def test_profiler_kit_phase_wins_over_everything(tmp_path):
    _, doc, _ = profile(tmp_path, "import profiler_kit\n" + textwrap.dedent(RECORD_FUNCTIONS).replace(
        'with torch.profiler.record_function("bwd")', 'with profiler_kit.phase("backward pass")'))
    assert doc["phase_rule"] == "marked" and list(doc["phases"]) == ["backward pass"]
    asked = profile(tmp_path, RECORD_FUNCTIONS, "--phase", "forward", "--phase", "opt")[1]
    assert asked["phase_rule"] == "asked" and list(asked["phases"]) == ["forward", "opt"]


def test_blocks_called_from_a_loop_are_one_forward_with_the_loss(tmp_path):
    _, doc, ranges = profile(tmp_path, """
        model = Net()
        loss_of = nn.MSELoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(3):
            x = batch()
            for block in model.blocks:  # no top module: each block is an outermost call
                x = block(x)
            loss_of(x, torch.zeros_like(x)).backward()
            opt.step()
            opt.zero_grad()
    """)
    assert marks(ranges).to_dict() == {"backward": 3, "forward": 3, "optimizer_step": 3, "step": 3}
    forwards = ranges[(ranges["kind"] == "auto") & (ranges["name"] == "forward")]
    backwards = ranges[(ranges["kind"] == "auto") & (ranges["name"] == "backward")]
    # Each forward runs from its first block up to its backward: the loss lies inside it.
    assert (backwards["start_ns"].to_numpy() - forwards["end_ns"].to_numpy() >= 0).all()
    in_phases = sum(phase["total_ns"] for phase in doc["phases"].values())
    assert in_phases >= 0.9 * doc["total_ns"], in_phases / doc["total_ns"]


def test_an_evaluation_pass_after_training_is_no_step(tmp_path):
    result, doc, ranges = profile(tmp_path, """
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(4):
            model(batch()).square().mean().backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            for _ in range(2):
                model(batch())
    """)
    assert "recorded the whole run, 4 steps" in result.stderr
    assert len(doc["steps"]) == 4 and "eval" in doc["phases"]
    assert marks(ranges).to_dict() == {"backward": 4, "forward": 6, "optimizer_step": 4, "step": 5}
