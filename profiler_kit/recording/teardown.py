"""A moment's pause before the program closes its process group, so that a recorded gloo job does not hang at exit.

PyTorch keeps the backward's context, a Python object, in the thread state that every collective started during a
backward carries (`torch.autograd.graph._engine_run_backward`). A gloo worker thread that drops a finished
collective of that kind must take the GIL. When the process group is torn down while such a thread waits for the GIL
(by `destroy_process_group`, or as DDP's reducer is freed right after it), the teardown holds the GIL and waits for
the thread, and the rank never exits (pytorch/pytorch#180700 is the same wait in the autograd threads). The
recorder's own work in each step makes that wait more likely. `install` wraps
`torch.distributed.destroy_process_group` so that it first releases the GIL for a few of the interpreter's switch
intervals: a thread waiting for it then finishes before the teardown starts. The program's call happens as before,
with its arguments and result, even when the pause fails (`notes`).
"""

from __future__ import annotations

import functools
import sys
import time

from profiler_kit.recording.notes import Notes

WHAT = "the pause that keeps a gloo job from hanging at exit"
# Switch intervals the pause lasts: a thread that asked for the GIL gets it within one.
PAUSE_INTERVALS = 10


def _pause() -> None:
    time.sleep(PAUSE_INTERVALS * sys.getswitchinterval())


def install(notes: Notes) -> None:
    """Wrap `destroy_process_group` where a program finds it (`torch.distributed` and its `distributed_c10d`)."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d

    original = distributed_c10d.destroy_process_group
    pause = notes.guard(WHAT, lambda: _pause())

    @functools.wraps(original)
    def destroy_process_group(*args, **kwargs):
        pause()
        return original(*args, **kwargs)

    distributed_c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group
