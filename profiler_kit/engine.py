"""Where the work of a job's reports runs: one task per report, here (`jobs` worker processes of this machine,
or this process alone with 1), or on a Dask cluster (`dask.distributed`, imported only then).

Each task gets one item (a report's path, which it reads where it lies: on a cluster, a path every worker sees,
on a shared file system) and returns what the caller merges; tasks run in any order and their results come back
in the order of the items. The input limits of this process (`--max-input-mb`) are set in every worker before
its task runs. With `keep_going`, a task that fails becomes a `Failure` naming its item and the error, and the
other tasks go on; without it, the first failure is raised as it was.

`scheduler`: None for this machine; `local` for a Dask LocalCluster of `jobs` worker processes started for the
run and closed after it; else the address of a running Dask scheduler (`tcp://host:8786`), whose workers run the
tasks.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from profiler_kit.errors import ProfilerKitError, first_line
from profiler_kit.files import InputLimits, current_limits, set_limits

LOCAL = "local"
# How long a client waits for a running scheduler to answer before giving up.
CONNECT_TIMEOUT = "20s"

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass(frozen=True)
class Failure:
    """A task that failed: its item, as text, and its error in one line."""

    item: str
    error: str


@dataclass(frozen=True)
class Engine:
    """Where tasks run (see the module docstring): `jobs` worker processes here, or a Dask `scheduler`."""

    jobs: int = 1
    scheduler: str | None = None

    @property
    def where(self) -> str:
        """Where the tasks run, in words."""
        if self.scheduler is None:
            return "this process" if self.jobs <= 1 else f"{self.jobs} worker processes"
        if self.scheduler == LOCAL:
            return f"a Dask LocalCluster of {self.jobs} worker processes"
        return f"the Dask cluster at {self.scheduler}"

    def map(self, task: Callable[[Item], Result], items: Sequence[Item],
            keep_going: bool = False) -> list[Result | Failure]:
        """`task` of each item, in the items' order (see the module docstring)."""
        call = partial(_run, task, current_limits(), keep_going)
        if self.scheduler is not None:
            return _on_dask(call, list(items), self.scheduler, self.jobs, keep_going)
        if self.jobs <= 1 or len(items) <= 1:
            return [call(item) for item in items]
        # Workers start afresh (spawn): a forked copy of a process that holds big frames would keep them alive.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(self.jobs, len(items)), mp_context=context) as pool:
            return list(pool.map(call, items))


def _run(task: Callable[[Item], Result], limits: InputLimits, keep_going: bool, item: Item) -> Result | Failure:
    """One task in a worker, under the caller's input limits."""
    set_limits(limits)
    if not keep_going:
        return task(item)
    try:
        return task(item)
    except Exception as exc:  # the item is named and the job goes on; the error says what it was
        return Failure(str(item), _one_line(exc))


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if isinstance(exc, ProfilerKitError) and text else first_line(exc)


def _on_dask(call: Callable[[Any], Any], items: list, scheduler: str, jobs: int, keep_going: bool) -> list:
    """The tasks on a Dask cluster, each result gathered as it comes; a task whose worker died (out of memory)
    is a failure like any other when `call` keeps going."""
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise ProfilerKitError("--scheduler needs dask.distributed, which is not installed: "
                               "pip install 'profiler-kit[dask]'") from None

    if scheduler == LOCAL:
        # Worker processes, one thread each (the readers hold the GIL); no dashboard, no logs below errors.
        cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=logging.ERROR)
        client = Client(cluster)
    else:
        cluster = None
        try:
            client = Client(scheduler, timeout=CONNECT_TIMEOUT)
        except OSError as exc:
            raise ProfilerKitError(f"cannot reach the Dask scheduler at {scheduler}: {first_line(exc)}") from None
    try:
        futures = client.map(call, items, pure=False)
        place = {future.key: i for i, future in enumerate(futures)}
        results: list = [None] * len(items)
        for future in as_completed(futures):
            i = place[future.key]
            try:
                results[i] = future.result()
            except Exception as exc:  # the worker itself failed (killed, lost)
                if not keep_going:
                    raise
                results[i] = Failure(str(items[i]), _one_line(exc))
            future.release()
        return results
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def absolute(path: str | os.PathLike) -> str:
    """A path as every worker of a cluster reads it: absolute, links kept."""
    return os.path.abspath(path)
