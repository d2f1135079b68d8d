"""Who made the job wait: per rank, the collectives it entered last and the time the other ranks spent waiting for
it, over the steady steps (lateness that repeats) apart from the rest (start-up: the warm-up steps and what ran
outside the steps, the one-off first collective among them).

For one matched collective, the rank that entered last held up every other: `delay` = its entry − the next
latest entry, how much later the collective began because of it alone; `caused_wait` = the sum over the other
ranks of its entry − theirs, the rank-time spent waiting for it. Entries are `collectives.Arrivals.entered`: on
the ranks' one clock, else from the collectives' durations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler_kit.kernels.collectives import Arrivals

# How many ranks the table names.
TOP = 10
NS_PER_MS = 1_000_000
REPEATED, ONCE, START_UP = "repeated", "once", "start-up"
BLAME_COLUMNS = ["rank", "times_last", "steps_last", "delay_ns", "caused_wait_ns", "startup_times_last",
                 "startup_caused_wait_ns"]


def blame(arrivals: Arrivals, steady: np.ndarray) -> pd.DataFrame:
    """One row per rank (in `arrivals.ranks` order): over the matched collectives of the mask `steady`, how many
    it entered last (`times_last`), in how many steps (`steps_last`), its `delay_ns` and `caused_wait_ns` summed;
    over the other collectives, `startup_times_last` and `startup_caused_wait_ns`."""
    count = len(arrivals.ranks)
    table = pd.DataFrame(0, index=range(count), columns=BLAME_COLUMNS)
    table["rank"] = arrivals.ranks
    if count < 2 or not len(arrivals.table):
        return table
    # Relative to each collective's first entry: starts on a clock far from its epoch would overflow in a sum.
    entered = arrivals.entered - arrivals.entered.min(axis=1, keepdims=True)
    last = np.argmax(entered, axis=1)
    latest = entered.max(axis=1)
    delay = latest - np.partition(entered, count - 2, axis=1)[:, count - 2]
    caused = count * latest.astype(float) - entered.sum(axis=1)
    steps = arrivals.table["step"].to_numpy()
    for mask, prefix in ((steady, ""), (~steady, "startup_")):
        table[f"{prefix}times_last"] = np.bincount(last[mask], minlength=count)
        table[f"{prefix}caused_wait_ns"] = np.bincount(last[mask], weights=caused[mask], minlength=count)
    table["delay_ns"] = np.bincount(last[steady], weights=delay[steady], minlength=count)
    pairs = pd.DataFrame({"rank": last[steady], "step": steps[steady]}).drop_duplicates()
    table["steps_last"] = np.bincount(pairs["rank"].to_numpy(dtype=np.int64), minlength=count)
    return table


def made_wait(table: pd.DataFrame, nodes: dict[int, int | None] | None = None, top: int = TOP) -> pd.DataFrame:
    """The `top` ranks of a `blame` table that made the others wait longest in the steady steps (then at
    start-up): rank (node, when `nodes` names some), lateness (`repeated`: last in two steady steps or more;
    `once`; `start-up`: only outside them), times_last, steps_last, delay_ms, caused_wait_ms, startup_times_last,
    startup_caused_wait_ms."""
    late = table[(table["times_last"] + table["startup_times_last"]) > 0]
    late = late.sort_values(["caused_wait_ns", "startup_caused_wait_ns", "rank"], ascending=[False, False, True],
                            kind="stable").head(top)
    out = pd.DataFrame({"rank": late["rank"].to_numpy()})
    if nodes and any(n is not None for n in nodes.values()):
        out["node"] = [nodes.get(r) for r in out["rank"]]
    steps_last = late["steps_last"].to_numpy()
    out["lateness"] = np.where(steps_last >= 2, REPEATED, np.where(steps_last == 1, ONCE, START_UP))
    out["times_last"] = late["times_last"].to_numpy()
    out["steps_last"] = steps_last
    for column in ("delay", "caused_wait", "startup_caused_wait"):
        out[f"{column}_ms"] = late[f"{column}_ns"].to_numpy() / NS_PER_MS
    out.insert(out.columns.get_loc("startup_caused_wait_ms"), "startup_times_last",
               late["startup_times_last"].to_numpy())
    return out
