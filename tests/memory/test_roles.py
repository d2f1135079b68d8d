"""Roles in snapshots built here in torch's snapshot format, as a plain training loop leaves them: parameters and
optimizer state from before the history (Adam, SGD with momentum, plain SGD, state made lazily in the trace),
gradients made by the autograd engine and freed by `zero_grad`, with C++ or Python-only stacks and with or without
`requested_size`; phases inferred where the snapshot names none; the recorder's list of storages, placed at the
moment each capture was taken, and the list built from a model and its optimizer."""

import pickle
from contextlib import nullcontext

import pytest
import torch
from snapshot_program import OPTIM, PARAM_SIZES, STATE_PER_PARAM, USER, WORKSPACE, ZERO_GRAD, Program

from profiler_kit.memory import analyze, analyze_file
from profiler_kit.memory.snapshot import EMBEDDED_KEY, SIDECAR_FORMAT, SIDECAR_VERSION
from profiler_kit.memory.storages import capture_storages, read_captures


def train(program: Program, optimizer: str, steps: int = 2, lazy_state: bool = False,
          zero_grad_range: bool = False) -> dict[str, list[int]]:
    """A training loop whose history starts after one warm-up step; returns the true addresses per role (the
    gradients' over the whole trace). `zero_grad_range`: `Optimizer.zero_grad` frees the gradients inside its
    own `record_function` range, as torch's optimizers do."""
    params = [program.alloc(size, [USER]) for size in PARAM_SIZES]
    k = STATE_PER_PARAM[optimizer]
    state = [] if lazy_state else [program.alloc(size, OPTIM) for size in PARAM_SIZES for _ in range(k)]
    workspace = program.alloc(WORKSPACE, [USER])
    grads = [program.alloc(size, engine=True) for size in PARAM_SIZES]  # the warm-up step's
    truth = {"parameter": params, "optimizer state": state, "gradient": list(grads), "unknown": [workspace]}
    program.recording = True
    for _ in range(steps):
        with program.range(f"Optimizer.zero_grad#{optimizer}.zero_grad") if zero_grad_range else nullcontext():
            for addr in grads:
                program.free(addr, ZERO_GRAD)
        saved = [program.alloc(300_000 + 512 * i, [USER]) for i in range(6)]  # forward: saved for backward
        scratch = program.alloc(2_000_000, [USER])
        program.free(scratch, [USER])
        logits_grad = program.alloc(3_000_000, engine=True)  # the backward's largest temporary: the peak
        grads = []
        for size, activation in zip(PARAM_SIZES, saved, strict=False):
            grads.append(program.alloc(size, engine=True))
            program.free(activation, engine=True)
        program.free(logits_grad, engine=True)
        for activation in saved[len(PARAM_SIZES):]:
            program.free(activation, engine=True)
        truth["gradient"] += grads
        with program.range(f"Optimizer.step#{optimizer}.step"):
            if lazy_state and not state:
                state = [program.alloc(size, OPTIM) for size in PARAM_SIZES for _ in range(k)]
                truth["optimizer state"] = state
            temp = program.alloc(64_000, OPTIM)
            program.free(temp, OPTIM)
    return truth


def roles_by_address(report) -> dict[int, str]:
    a = report.recon.allocations
    return dict(zip(a["addr"], report.roles, strict=True))


def check_roles(report, truth: dict[str, list[int]]) -> None:
    roles = roles_by_address(report)
    a = report.recon.allocations
    for role in ("optimizer state", "gradient", "unknown"):
        assert sorted(addr for addr, r in roles.items() if r == role and addr in set(a["addr"])) == \
            sorted(set(truth[role])), role
    # Same-size parameters and their state are told apart by count only: the bytes per role are exact.
    sizes = dict(zip(a["addr"], a["size_bytes"], strict=True))
    assert sorted(sizes[addr] for addr, r in roles.items() if r == "parameter") == sorted(PARAM_SIZES)


@pytest.mark.parametrize("stacks", ["all", "python"])
@pytest.mark.parametrize("optimizer", ["adam", "sgd-momentum", "sgd"])
def test_persistent_blocks_divide_into_parameters_and_optimizer_state(optimizer, stacks):
    program = Program(stacks)
    truth = train(program, optimizer, zero_grad_range=stacks == "python")
    report = analyze(program.snapshot())
    roles = roles_by_address(report)
    a = report.recon.allocations
    before = a.loc[a["start"] == -1, "addr"]
    params_and_state = sorted(addr for addr in before if roles[addr] in ("parameter", "optimizer state"))
    assert params_and_state == sorted(truth["parameter"] + truth["optimizer state"])
    assert sum(roles[addr] == "optimizer state" for addr in before) == STATE_PER_PARAM[optimizer] * len(PARAM_SIZES)
    assert sorted(addr for addr, role in roles.items() if role == "gradient") == sorted(truth["gradient"])
    evidence = dict(zip(a["addr"], report.evidence, strict=True))
    assert evidence[truth["unknown"][0]].endswith("no gradient of the trace has its size")
    assert roles[truth["unknown"][0]] == "unknown"
    if optimizer == "adam":
        assert "Adam's exp_avg, exp_avg_sq" in evidence[truth["parameter"][0]]
    # Phases: the snapshot names only PyTorch's optimizer steps (and zero_grad, never a phase), which end each
    # step; forward and backward are inferred.
    assert [s.label for s in report.spans] == [f"step {k}, {phase}" for k in (0, 1)
                                               for phase in ("forward", "backward", "optimizer_step")]
    assert [s.source for s in report.spans] == ["inferred", "inferred", "pytorch"] * 2
    assert report.summary.loc[0, "peak_phase"] == "step 0, backward"
    kinds = dict(zip(a["size_bytes"], report.roles, strict=False))
    assert kinds[3_000_000] == "temporary" and kinds[2_000_000] == "temporary" and kinds[300_000] == "activation"


def test_optimizer_state_made_in_the_trace_is_known_from_its_stack():
    """A fused AdamW makes its state at the first step: when the history covers it, the state is not older than
    the trace, its stack is torch/optim's and the persistent blocks are the parameters alone."""
    program = Program("python")
    truth = train(program, "adam", lazy_state=True)
    report = analyze(program.snapshot())
    check_roles(report, truth)
    evidence = dict(zip(report.recon.allocations["addr"], report.evidence, strict=True))
    assert evidence[truth["optimizer state"][0]] == "made by torch/optim, kept after it"
    # The state the stacks found counts towards Adam's two tensors a parameter: the old blocks are parameters alone.
    assert "sized like a gradient: per gradient, its parameter and 2 optimizer-state tensors" in \
        evidence[truth["parameter"][0]]


def test_a_history_from_the_start_of_the_program_names_parameters_by_their_stacks():
    """Recorded from the first CUDA allocation: `.cuda()` makes the parameters (`Module._apply`), the first step
    the optimizer state (torch/optim); nothing is older than the trace and nothing is matched by size."""
    program = Program("python")
    program.recording = True
    to_cuda = [{"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", "line": 930,
                "name": "_apply"}, USER]
    params = [program.alloc(size, to_cuda) for size in PARAM_SIZES]
    saved = program.alloc(300_000, [USER])
    grads = [program.alloc(size, engine=True) for size in PARAM_SIZES]
    program.free(saved, engine=True)
    with program.range("Optimizer.step#adam.step"):
        state = [program.alloc(size, OPTIM) for size in PARAM_SIZES for _ in range(2)]
    report = analyze(program.snapshot())
    roles = roles_by_address(report)
    assert [roles[a] for a in params] == ["parameter"] * len(params)
    assert {roles[a] for a in grads} == {"gradient"} and {roles[a] for a in state} == {"optimizer state"}
    assert roles[saved] == "activation"
    assert [s.label for s in report.spans] == ["step 0, forward", "step 0, backward", "step 0, optimizer_step"]
    assert report.spans[0].start == len(params)  # the forward starts after the model is on the device


def test_rounded_block_sizes_still_match_the_requested_gradient_sizes():
    """Without `requested_size` a block's size is the allocator's (512 B multiples); gradients in the trace have
    their requested size, so both are compared rounded."""
    program = Program()
    truth = train(program, "adam")
    snapshot = program.snapshot(requested_size=False)
    report = analyze(snapshot)
    roles = roles_by_address(report)
    assert sorted(a for a, r in roles.items() if r in ("parameter", "optimizer state")) == \
        sorted(truth["parameter"] + truth["optimizer state"])


def test_more_blocks_of_a_size_than_parameters_and_state_stay_unknown():
    program = Program()
    extra = program.alloc(PARAM_SIZES[0], [USER])  # a buffer sized like the first parameter
    truth = train(program, "sgd-momentum")
    report = analyze(program.snapshot())
    roles = roles_by_address(report)
    same_size = [a for a in [extra, *truth["parameter"], *truth["optimizer state"]]
                 if report.recon.allocations.set_index("addr").loc[a, "size_bytes"] == PARAM_SIZES[0]]
    assert sorted(roles[a] for a in same_size) == ["optimizer state", "parameter", "unknown"]
    unknown = report.roles_at_peak.set_index("role").loc["unknown", "evidence"]
    assert "more blocks of its size than parameters and their optimizer state (2 per gradient)" in unknown


def listed_meta(captures: list[dict]) -> dict:
    return {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "storages": captures}


def test_the_recorders_list_is_placed_at_the_moment_of_each_capture():
    """The list wins over sizes: each capture names what was alive at its moment (the warm-up's gradients at
    window start, the step's at its optimizer step); a listed address whose size differs is not matched."""
    program = Program()
    truth = train(program, "adam", steps=1)
    params = [[a, s] for a, s in zip(truth["parameter"], PARAM_SIZES, strict=True)]
    state = [[a, program.live[a][0]] for a in truth["optimizer state"]]
    grads = [[a, program.live[a][0]] for a in truth["gradient"][len(PARAM_SIZES):]]
    warmup = [[a, s] for a, s in zip(truth["gradient"][:len(PARAM_SIZES)], PARAM_SIZES, strict=True)]
    start_us = program.trace[0]["time_us"] - 1
    captures = [
        {"label": "window start", "time_us": start_us, "parameter": params, "gradient": warmup,
         "optimizer_state": state},
        {"label": "optimizer step 0", "time_us": program.time_us, "parameter": params, "gradient": grads,
         "optimizer_state": state[:-1] + [[state[-1][0], state[-1][1] + 4]]},  # the last one's size is wrong
    ]
    report = analyze(program.snapshot(), listed_meta(captures))
    roles = roles_by_address(report)
    evidence = dict(zip(report.recon.allocations["addr"], report.evidence, strict=True))
    assert all(roles[a] == "gradient" for a, _ in warmup + grads)
    assert evidence[warmup[0][0]] == "in the recorder's list of gradient storages taken at window start"
    assert evidence[grads[0][0]] == "in the recorder's list of gradient storages taken at optimizer step 0"
    assert evidence[params[0][0]] == "in the recorder's list of parameter storages taken at window start"
    # The size-matching does not run beside a list: what the list does not name is not guessed.
    assert roles[state[-1][0]] == "optimizer state"  # listed at window start with its right size
    assert roles[truth["unknown"][0]] == "unknown"
    assert evidence[truth["unknown"][0]].endswith("not in the recorder's list")
    # A capture names only what was alive when it was taken: the step's gradients did not exist at window start.
    # A listed size that is not the allocation's does not match it either.
    early = {"label": "window start", "time_us": start_us, "gradient": grads,
             "parameter": [[truth["unknown"][0], WORKSPACE + 512]], "optimizer_state": []}
    early_report = analyze(program.snapshot(), listed_meta([early]))
    early_evidence = dict(zip(early_report.recon.allocations["addr"], early_report.evidence, strict=True))
    assert early_evidence[grads[0][0]] == "made by the autograd engine, kept after it"
    assert early_evidence[truth["unknown"][0]].endswith("not in the recorder's list")


def test_old_recordings_list_addresses_at_the_snapshot():
    meta = {"tensor_roles": {"parameter": [1, 2], "gradient": [3], "adamw_state": [4, 5]}}
    (capture,) = read_captures(meta)
    assert capture.time_us is None
    assert capture.storages == {1: ("parameter", None), 2: ("parameter", None), 3: ("gradient", None),
                                4: ("optimizer_state", None), 5: ("optimizer_state", None)}


@pytest.mark.parametrize("make, per_param", [
    (lambda p: torch.optim.AdamW(p, lr=1e-3), 3),  # exp_avg, exp_avg_sq and the step counter tensor
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 1),  # momentum_buffer
    (lambda p: torch.optim.SGD(p, lr=0.1), 0),
])
def test_capture_lists_the_storages_of_a_model_and_its_optimizer(make, per_param):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    optimizer = make(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    before = capture_storages(model.parameters(), [optimizer], label="window start", time_us=7)
    optimizer.step()
    after = capture_storages(model.parameters(), [optimizer], label="optimizer step 0")
    params = list(model.parameters())
    expected = [[p.untyped_storage().data_ptr(), p.untyped_storage().nbytes()] for p in params]
    assert before["parameter"] == after["parameter"] == expected
    assert before["gradient"] == [[p.grad.data_ptr(), p.grad.numel() * 4] for p in params]
    assert before["optimizer_state"] == [] and before["time_us"] == 7 and before["label"] == "window start"
    assert "time_us" not in after  # stands for the moment of the snapshot
    state = [t for p in params for t in optimizer.state[p].values() if torch.is_tensor(t)]
    assert after["optimizer_state"] == [[t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()]
                                        for t in state]
    assert len(after["optimizer_state"]) == per_param * len(params)
    # Read back as the analysis reads it.
    (read_before, read_after) = read_captures(listed_meta([after, before]))
    assert read_before.label == "window start" and read_after.storages[expected[0][0]] == ("parameter",
                                                                                           expected[0][1])


def test_capture_lists_a_shared_storage_once():
    embedding = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight  # tied weights: one storage
    capture = capture_storages([*embedding.parameters(), *head.parameters()])
    assert capture["parameter"] == [[embedding.weight.data_ptr(), 10 * 4 * 4]]


def test_a_snapshot_carrying_only_the_list_is_read_from_the_pickle_alone(tmp_path):
    """What a program's recorder writes: the snapshot with the list inside, no sidecar, no other metadata."""
    program = Program()
    truth = train(program, "adam", steps=1)
    sizes = {addr: size for addr, (size, _, _) in program.live.items()}
    capture = {"label": "the snapshot", **{kind: [[a, sizes[a]] for a in truth[role]] for kind, role in
                                           [("parameter", "parameter"), ("optimizer_state", "optimizer state")]}}
    path = tmp_path / "run.pickle"
    path.write_bytes(pickle.dumps(dict(program.snapshot(), **{EMBEDDED_KEY: listed_meta([capture])}), protocol=4))
    report = analyze_file(path)
    assert report.meta_source == "snapshot"
    roles = roles_by_address(report)
    assert [roles[a] for a in truth["parameter"]] == ["parameter"] * len(PARAM_SIZES)
    assert {roles[a] for a in truth["optimizer state"]} == {"optimizer state"}
