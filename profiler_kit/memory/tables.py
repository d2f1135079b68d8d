"""Tables about the peak of a snapshot: its largest allocations with role, phase and code, and the model's big
tensors expected from the workload config beside what was measured for the same role."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from profiler_kit.memory.analyze import BEFORE_TRACE, MIB, Reconstruction, first_user_frame, short_path
from profiler_kit.memory.phases import Phases, phase_at
from profiler_kit.memory.roles import (
    ACTIVATION,
    AUTOCAST_COPY,
    GRADIENT,
    OPTIMIZER_STATE,
    PARAMETER,
    STEP_COUNTER_BYTES,
)
from profiler_kit.names import BACKWARD, OPTIMIZER_STEP, phases_for
from profiler_kit.presets import count_parameters, from_name

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
DISPLAY_POSITION = "#"
# `position`: 1 for the largest (people's tables call it `#`, DISPLAY_POSITION).
TOP_COLUMNS = ["position", "size_mib", "size_bytes", "role", "evidence", "allocated_in", "where", "function",
               "user_metadata"]


def top_allocations(recon: Reconstruction, roles: pd.DataFrame, phases: Phases, n: int) -> pd.DataFrame:
    """The n largest allocations alive at the peak, with their role and its evidence (`roles`: the columns role and
    evidence per allocation), the phase that allocated them, the first frame outside torch and the user metadata
    set when they were made."""
    alive = recon.alive_at(recon.peak_index).sort_values("size_bytes", ascending=False, kind="stable").head(n)
    rows = []
    for position, (idx, row) in enumerate(alive.iterrows(), start=1):
        frame = first_user_frame(row["frames"])
        rows.append({
            "position": position,
            "size_mib": row["size_bytes"] / MIB,
            "size_bytes": int(row["size_bytes"]),
            "role": roles.at[idx, "role"],
            "evidence": roles.at[idx, "evidence"],
            "allocated_in": phase_at(phases, int(row["start"])),
            "where": f"{short_path(frame['filename'])}:{frame['line']}" if frame else None,
            "function": frame["name"] if frame else None,
            "user_metadata": row["user_metadata"] or None,
        })
    # Indexed like recon.allocations, so a renderer can reach each row's full stack.
    return pd.DataFrame(rows, columns=TOP_COLUMNS, index=alive.index)


def frame_with_optional_ints(rows: list[dict], columns: list[str], optional_ints: tuple[str, ...]
                              ) -> pd.DataFrame:
    """A DataFrame whose listed columns keep Python ints and None (pandas would turn them into floats)."""
    df = pd.DataFrame(rows, columns=columns)
    for col in optional_ints:
        df[col] = pd.Series([row[col] for row in rows], index=df.index, dtype=object)
    return df


def parameter_tensor_count(num_layers: int) -> int:
    """Parameter tensors of `TransformerLM`: per layer two RMSNorm gains, fused QKV, output projection and the
    three SwiGLU matrices; plus embedding, final RMSNorm and LM head."""
    return 7 * num_layers + 3


@dataclass(frozen=True)
class ExpectedTensor:
    """A big tensor of the config, matched to allocations of its role (and, for activations, of its size)."""

    tensor: str
    dtype: str
    formula: str
    role: str
    sizes: tuple[int, ...] = ()
    expected_count: int | None = None
    expected_total_bytes: int | None = None


def expected_tensors(config: dict) -> list[ExpectedTensor]:
    """Model state (parameters, gradients, AdamW moments), autocast's weight copies and the largest activations
    of a workload config."""
    mc = from_name(config["model"], config["ctx"])
    phases = phases_for(config["mode"])
    b, t, d, h, f, v = config["batch_size"], config["ctx"], mc.d_model, mc.num_heads, mc.d_ff, mc.vocab_size
    n_params, n_tensors = count_parameters(mc), parameter_tensor_count(mc.num_layers)
    fp32 = DTYPE_BYTES["fp32"]
    state = [("parameters", PARAMETER, 1)]
    if BACKWARD in phases:
        state.append(("gradients", GRADIENT, 1))
    if OPTIMIZER_STEP in phases:
        state.append(("AdamW state (exp_avg, exp_avg_sq)", OPTIMIZER_STATE, 2))
    out = [
        ExpectedTensor(name, "fp32", f"{k}×{n_params:,} params × {fp32} B", role,
                       expected_count=k * n_tensors, expected_total_bytes=k * n_params * fp32)
        for name, role, k in state
    ]
    if config["mixed_precision"]:
        # Autocast keeps a bf16 copy of every Linear weight for the forward pass (its weight cast cache).
        per_layer = [3 * d * d, d * d, d * f, d * f, f * d]
        weights = per_layer * mc.num_layers + [d * v]
        bf16 = DTYPE_BYTES["bf16"]
        out.append(ExpectedTensor(
            "bf16 copies of Linear weights (autocast)", "bf16", f"5·{mc.num_layers}+1 weights × {bf16} B",
            AUTOCAST_COPY, sizes=tuple(w * bf16 for w in weights), expected_count=len(weights),
            expected_total_bytes=sum(weights) * bf16,
        ))
    dtypes = ["fp32", "bf16"] if config["mixed_precision"] else ["fp32"]
    activations = [
        ("B·T·d activations (residual stream)", f"{b}·{t}·{d}", b * t * d),
        ("attention scores B·h·T²", f"{b}·{h}·{t}²", b * h * t * t),
        ("FFN hidden B·T·d_ff", f"{b}·{t}·{f}", b * t * f),
        ("logits B·T·V", f"{b}·{t}·{v}", b * t * v),
    ]
    for name, formula, elements in activations:
        for dtype in dtypes:
            size = elements * DTYPE_BYTES[dtype]
            out.append(ExpectedTensor(name, dtype, f"{formula} × {DTYPE_BYTES[dtype]} B", ACTIVATION,
                                      sizes=(size,)))
    return out


def expected_vs_measured(recon: Reconstruction, roles: pd.Series, config: dict) -> pd.DataFrame:
    """Each expected tensor beside the allocations of its role (activations: of its role and size), alive at
    the peak and allocated in the trace; model state also per parameter of the model."""
    a = recon.allocations
    at_peak = (a["start"] <= recon.peak_index) & (a["end"] > recon.peak_index)
    in_trace = a["start"] != BEFORE_TRACE
    n_params = count_parameters(from_name(config["model"], config["ctx"]))
    rows = []
    for exp in expected_tensors(config):
        match = roles == exp.role
        if exp.role == ACTIVATION:
            match &= a["size_bytes"].isin(set(exp.sizes))
        elif exp.role == OPTIMIZER_STATE:  # the moments, not a fused AdamW's scalar step counters
            match &= ~a["size_bytes"].isin(STEP_COUNTER_BYTES)
        total_at_peak = int(a.loc[match & at_peak, "size_bytes"].sum())
        state = exp.role in (PARAMETER, GRADIENT, OPTIMIZER_STATE)
        rows.append({
            "tensor": exp.tensor,
            "dtype": exp.dtype,
            "role": exp.role,
            "formula": exp.formula,
            "bytes_each": exp.sizes[0] if len(set(exp.sizes)) == 1 else None,
            "expected_count": exp.expected_count,
            "expected_total_mib": None if exp.expected_total_bytes is None
            else exp.expected_total_bytes / MIB,
            "count_at_peak": int((match & at_peak).sum()),
            "total_at_peak_mib": total_at_peak / MIB,
            "bytes_per_param_at_peak": total_at_peak / n_params if state else None,
            "allocs_in_trace": int((match & in_trace).sum()),
        })
    return frame_with_optional_ints(rows, list(rows[0]), ("bytes_each", "expected_count"))
