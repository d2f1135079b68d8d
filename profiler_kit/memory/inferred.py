"""Phases of a snapshot that names none, inferred from the stacks of what its trace allocates and frees.

A plain script's snapshot carries at most PyTorch's own ranges (`Optimizer.step#…`): between them, each trace
entry says what ran by the stack that allocated or freed there (`evidence.allocation_marks`): the autograd
engine, the `backward()` call or code that runs inside a backward (activation checkpointing's recomputation,
FSDP's backward hooks) is a backward; `torch/optim` an optimizer step; other Python code, not a module's
constructor or its move to the device nor gradient clipping, a forward. Runs of one kind become phases.
"""

from __future__ import annotations

import numpy as np

from profiler_kit.memory.analyze import Reconstruction
from profiler_kit.memory.evidence import BACKWARD_CALL, CLIP_GRAD, ENGINE, IN_BACKWARD, MODULE_INIT, OPTIMIZER, PYTHON
from profiler_kit.names import PHASES

# Kinds of evidence an entry of the trace gives about the phase it runs in.
_FORWARD, _BACKWARD, _OPTIMIZER = 1, 2, 3
_NAMES = dict(zip((_FORWARD, _BACKWARD, _OPTIMIZER), PHASES, strict=True))
_BACKWARD_MARKS = frozenset({ENGINE, BACKWARD_CALL, IN_BACKWARD})
# Python code that is not a forward: building the model or moving it to the device, clipping gradients.
_NOT_FORWARD = frozenset({MODULE_INIT, CLIP_GRAD})


def _entry_kinds(recon: Reconstruction, made: list[frozenset[str]], freed: list[frozenset[str]]
                 ) -> np.ndarray:
    """Per trace entry: backward where backward code allocates or frees, optimizer where `torch/optim`
    allocates, forward where other Python code allocates (not a module's constructor or its move to the device,
    not gradient clipping); 0 elsewhere."""
    n = recon.n_entries
    kinds = np.zeros(n, dtype=np.int8)
    a = recon.allocations
    for start, end, m, f in zip(a["start"], a["end"], made, freed, strict=True):
        if start >= 0:
            if m & _BACKWARD_MARKS:
                kinds[start] = _BACKWARD
            elif OPTIMIZER in m:
                kinds[start] = _OPTIMIZER
            elif PYTHON in m and not m & _NOT_FORWARD:
                kinds[start] = _FORWARD
        if end < n and f & _BACKWARD_MARKS:
            kinds[end] = _BACKWARD
    return kinds


def inferred_runs(recon: Reconstruction, covered: list[tuple[int, int]], made: list[frozenset[str]],
                  freed: list[frozenset[str]]) -> list[tuple[str, int, int]]:
    """(phase, first entry, end entry) of the forwards, backwards and optimizer steps inferred outside the
    `covered` entry ranges [start, end) (PyTorch's optimizer steps), when the stacks show a backward
    (`made`/`freed`: each allocation's marks, from `evidence.allocation_marks`). A forward runs from the first
    entry that Python code allocates in to the next run's first entry (or the next covered entry); a backward
    (an optimizer step) from its first to its last entry of backward (optimizer) work, so that what is kept after
    it (gradients, optimizer state) outlives it."""
    if recon.n_entries == 0:
        return []
    kinds = _entry_kinds(recon, made, freed)
    inside = np.zeros(recon.n_entries + 1, dtype=bool)
    for start, end in covered:
        inside[start:end] = True
    kinds[inside[:-1]] = 0
    if not (kinds == _BACKWARD).any():
        return []
    inside_before = np.concatenate(([0], np.cumsum(inside)))  # covered entries before each index
    runs: list[list[int]] = []  # [kind, first entry, last entry]
    for i in np.flatnonzero(kinds):
        if runs and runs[-1][0] == kinds[i] and inside_before[i] == inside_before[runs[-1][2]]:
            runs[-1][2] = int(i)
        else:
            runs.append([int(kinds[i]), int(i), int(i)])
    out = []
    for k, (kind, first, last) in enumerate(runs):
        end = last + 1
        if kind == _FORWARD:
            stop = runs[k + 1][1] if k + 1 < len(runs) else recon.n_entries
            later = np.flatnonzero(inside[first:stop])
            end = first + int(later[0]) if len(later) else stop
        out.append((_NAMES[kind], first, end))
    return out
