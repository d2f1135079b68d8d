"""What a recorded process recorded (its window), its step clock, and the file it says it in (`channel`).

The window is the steps `profiler_kit.capture` marks, else the program's `torch.cuda.profiler.start()`/`stop()`,
else the whole run. The step clock hears every `step` mark of the range events (the program's own steps under
`capture`, else the automatic ones, `marks`) and times every step the program runs, recorded or not: the
parent compares the recorded steps' times with the others'. An evaluation pass after the last training step is
no step (`phase_rule.evaluation_steps`), neither timed nor counted. A step's time is from its start to the next step's
start (its whole loop iteration, the program's waits included); the last step's, and that of a step after
which the window opened or closed, is its own length (the recorder's start or stop is no part of it); a step
during which the window opened or closed is left out.
The window's steps are counted by the step rule (`phase_rule.window_steps`) from the ranges the main thread opens
at its top level (`StepCounter`) and the step marks, as its reports' step tables count them.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from profiler_kit.names import BACKWARD, KIND_AUTO, OPTIMIZER_STEP, STEP
from profiler_kit.phase_rule import counted_at_top, evaluation_steps, window_steps
from profiler_kit.recording.channel import MAX_STEP_TIMES, WHOLE_RUN, write_window
from profiler_kit.recording.notes import Notes

NS_PER_MS = 1_000_000
# The marks a step is told by: the position of each one's flag in a step's entry.
HELD = {OPTIMIZER_STEP: 4, BACKWARD: 5}


class StepCounter:
    """Counts the ranges opened at the top level of the main thread while it is on (`phase_rule.counted_at_top`),
    by name, for the step rule."""

    def __init__(self) -> None:
        self.depth = 0
        self.on = True
        self.counts: Counter[str] = Counter()
        self.main = threading.main_thread()

    def __call__(self, opened: bool, name: str, kind: str, _token: int, _number: int | None) -> None:
        if kind == KIND_AUTO or threading.current_thread() is not self.main:
            return
        if not opened:
            self.depth = max(self.depth - 1, 0)
            return
        if self.depth == 0 and self.on and counted_at_top(name):
            self.counts[name] += 1
        self.depth += 1

    def restart(self) -> None:
        self.counts.clear()
        self.on = True


class StepClock:
    """When each step started and ended, whether the window was open when it started, and whether it held an
    optimizer step and a backward (an evaluation pass is no step: `phase_rule.evaluation_steps`)."""

    def __init__(self) -> None:
        # token → [number, start_ns, end_ns | None, recorded, holds an optimizer step, holds a backward]
        self.steps: dict[int, list] = {}
        self.open: list | None = None  # the step open now
        self.recording = True  # a whole run records from the start
        self.transitions: list[int] = []  # when the window opened or closed

    def __call__(self, opened: bool, name: str, kind: str, token: int, number: int | None) -> None:
        if kind != KIND_AUTO:
            return
        if name in HELD and opened and self.open is not None:
            self.open[HELD[name]] = True
        if name != STEP or number is None:
            return
        now = time.perf_counter_ns()
        if opened:
            self.open = self.steps[token] = [number, now, None, self.recording, False, False]
        elif token in self.steps:
            self.steps[token][2] = now
            if self.open is self.steps[token]:
                self.open = None

    def window(self, opened: bool) -> None:
        """The window opens (what was recorded before is dropped) or closes."""
        if opened:
            for entry in self.steps.values():
                entry[3] = False
        self.recording = opened
        self.transitions.append(time.perf_counter_ns())

    def training(self) -> list[list]:
        """The steps in the order they started, less the evaluation passes."""
        entries = sorted(self.steps.values(), key=lambda entry: entry[1])
        passes = evaluation_steps([entry[4] for entry in entries], [entry[5] for entry in entries])
        return [entry for entry, evaluated in zip(entries, passes, strict=True) if not evaluated]

    def recorded(self) -> int:
        return sum(1 for entry in self.training() if entry[3])

    def times(self) -> list[list]:
        """[number, ms, recorded (0/1)] of each timed step, in the order the steps started."""
        entries = self.training()
        out = []
        for i, (number, start, end, recorded, _, _) in enumerate(entries):
            stop = entries[i + 1][1] if i + 1 < len(entries) else end
            if stop is not None and any(start < t <= stop for t in self.transitions):
                stop = end  # the window opened or closed after the step: its own length
            if stop is None or any(start < t <= stop for t in self.transitions):
                continue
            out.append([number, round((stop - start) / NS_PER_MS, 4), int(recorded)])
        return out[:MAX_STEP_TIMES]


class ChildWindow:
    """The child's half of the window (the parent's is `runner.ParentWindow`): what this process records, said
    once for the parent (`channel.write_window` into the job's `folder`)."""

    def __init__(self, notes: Notes, folder: str | None, rank: int | None = None) -> None:
        self.folder = folder
        self.kind = WHOLE_RUN
        self.steps: int | None = None
        self.counter = StepCounter()
        self.clock = StepClock()
        self.notes = notes
        self.rank = rank
        self.nvtx_dropped = False
        self.reported = False
        self.closed = False

    def observers(self) -> list:
        """The range-event observers that feed this window: its step counter and its step clock."""
        return [self.notes.guard("the step count", self.counter), self.notes.guard("the step clock", self.clock)]

    def open(self, kind: str) -> None:
        self.kind = kind
        self.counter.restart()
        self.clock.window(True)

    def close(self, steps: int | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        self.counter.on = False
        self.clock.window(False)
        if steps is None:
            steps = window_steps(self.counter.counts, self.clock.recorded())
        self.steps = steps

    def report(self) -> None:
        if self.reported:
            return
        self.reported = True
        self.close()
        said = {"kind": self.kind, "steps": self.steps, "nvtx_dropped": self.nvtx_dropped, "rank": self.rank,
                "step_ms": self.clock.times(), "notes": self.notes.lines}
        if self.folder:
            write_window(self.folder, said)
