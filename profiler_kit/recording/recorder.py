"""The recorder contract: what every recorder inside a profiled program (Nsight Systems' capture range, torch.profiler,
the CUDA memory history) is told, by whom and when, and what the recorders share."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from profiler_kit.errors import literal
from profiler_kit.recording.channel import CAPTURE, PROGRAM_WINDOW
from profiler_kit.recording.marks import Marks
from profiler_kit.recording.notes import Notes
from profiler_kit.recording.window import ChildWindow


class Recorder:
    """One recorder in a recorded process, built by `child.install_from_environment` with the process's window
    (`window.ChildWindow`), its automatic marks (`marks.Marks`), its notes and guard (`notes.Notes`) and its place
    in the job (`place`: rank, world_size, local_rank, node, those it has). The whole contract, in the order of
    a run:

    - `observers()`: the range-event observers it needs; the child adds them to `nvtx_ranges.observe`.
    - `begin()`: the program is about to run: record from now (the whole run) unless a window opens, and
      finish the recording at exit.
    - `declare()`: the program made a `profiler_kit.capture` (`api`): its steps are the program's, and the
      window is the steps it marks.
    - `describe(fields)`: plain JSON fields the program adds to the recording's metadata (`api.describe`).
    - `start(kind)`: the window opens: the marked steps begin (`capture`, kind `CAPTURE`) or the program
      called `torch.cuda.profiler.start()` (kind `PROGRAM_WINDOW`).
    - `stop(steps)`: the window closes with `steps` recorded (None: at exit or at the program's own stop, where
      the marks still open are closed and the steps counted by the window).
    - `program_start()`, `program_stop()`: the program's own `torch.cuda.profiler.start()`/`stop()`
      (`mirror.patch_cuda_profiler`); by default the window opens and closes as for `start` and `stop`.

    Every call but `observers` and `begin` comes through `child.Guarded`, so that a recorder failing to open or
    close its window never stops the program; a recorder wraps the observers it gives in the guard itself
    (`notes.guard`). Each recorder keeps the window up to date (`window.open`, `window.close`) and has it said
    to the parent (`window.report`) once the recording is written."""

    def __init__(self, window: ChildWindow, marks: Marks, notes: Notes, place: dict[str, int]) -> None:
        self.window = window
        self.marks = marks
        self.notes = notes
        self.place = place
        self.described: dict = {}
        self.done = False

    def observers(self) -> list[Callable]:
        return []

    def begin(self) -> None:
        raise NotImplementedError

    def declare(self) -> None:
        self.marks.capture_steps()

    def describe(self, fields: dict) -> None:
        self.described.update(fields)

    def start(self, kind: str = CAPTURE) -> None:
        raise NotImplementedError

    def stop(self, steps: int | None = None) -> None:
        raise NotImplementedError

    def program_start(self) -> None:
        self.start(PROGRAM_WINDOW)

    def program_stop(self) -> None:
        self.stop()

    def _end_window(self, steps: int | None) -> None:
        """The window closes: `steps` recorded (None: at the program's exit or its own stop(), where the marks
        still open are closed first)."""
        self.done = True
        if steps is None:
            self.marks.finish()
        self.window.close(steps)

    @staticmethod
    def _write(path: Path, write: Callable[[], object]) -> None:
        """`write()` the recording to `path`; failing at the program's exit: one line on its stderr."""
        try:
            write()
        except OSError as exc:
            print(f"profiler-kit: {literal(path)}: could not be written ({exc.strerror or exc})", file=sys.stderr)
