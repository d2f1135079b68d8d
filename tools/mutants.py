"""Mutation testing of one room of the package (recording, kernels, memory) against that room's own tests, with
mutmut: how many of the small bugs mutmut seeds into the room's code its tests catch.

Each room runs in a scratch copy of the repository's files (`--workdir`, one folder per room, kept between runs
so that mutmut resumes where it stopped), never in the working tree: mutmut rewrites every function of the
mutated modules there, under its `mutants/` folder. The copy's `setup.cfg` tells mutmut which modules to mutate
(the room's, or `--module` ones) and which tests select the mutants' tests (the room's, or `--tests`).

A mutant that no test can tell from the original (equivalent) is named in EQUIVALENT (tests/mutants_equivalent.txt)
by its change, the original line and the mutated one, with the reason, so that the names mutmut numbers anew
after an edit do not matter. Prints one row per room: mutants, killed, survived, equivalent (survivors listed
there), timed out, the rest, and the score: killed and timed out over all mutants but the equivalent ones; then the
other survivors with their change (`mutmut show NAME` in the room's folder prints the whole diff).

    python tools/mutants.py --room kernels --module profiler_kit/kernels/noise.py --tests tests/kernels/test_noise.py
    python tools/mutants.py                     # every room against its own tests: hours on a 2-core machine
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Each room: the modules mutated and the test folders that exercise them.
ROOMS = {
    "recording": ("profiler_kit/recording/*", ["tests/profile", "tests/nsys"]),
    "kernels": ("profiler_kit/kernels/*", ["tests/kernels"]),
    "memory": ("profiler_kit/memory/*", ["tests/memory"]),
}
# mutmut's statuses of a mutant, by what they mean for it.
KILLED, SURVIVED, TIMEOUT = "killed", "survived", "timeout"
EQUIVALENT = Path(__file__).resolve().parents[1] / "tests" / "mutants_equivalent.txt"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--room", action="append", choices=sorted(ROOMS),
                        help="a room to mutate (repeatable; default: all three)")
    parser.add_argument("--module", action="append", default=[],
                        help="mutate only this module of the room (a path from the repository root; repeatable)")
    parser.add_argument("--tests", action="append", default=[],
                        help="the tests to run instead of the room's (a path; repeatable)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/profiler-kit-mutants"),
                        help="where each room's copy goes (default: /tmp/profiler-kit-mutants)")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1,
                        help="mutants tested at once (default: the number of cores)")
    parser.add_argument("--fresh", action="store_true", help="start each room over instead of resuming")
    parser.add_argument("--mutant", action="append", default=[],
                        help="test only this mutant again (a name mutmut gave; repeatable)")
    parser.add_argument("--no-run", action="store_true",
                        help="only score what the rooms' folders hold from earlier runs")
    return parser.parse_args()


def tracked_files() -> list[str]:
    """The repository's files, committed or not, that git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True).stdout
    return [name for name in listed.decode().split("\0") if name and (REPO / name).is_file()]


def prepare(folder: Path, mutate: list[str], tests: list[str], fresh: bool) -> None:
    """The room's copy of the repository with its mutmut configuration; what mutmut left there is kept unless
    `fresh` (a changed file makes mutmut test its mutants again)."""
    if fresh and folder.exists():
        shutil.rmtree(folder)
    for name in tracked_files():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    lines = ["[mutmut]", "source_paths = profiler_kit", "only_mutate =", *(f"    {m}" for m in mutate),
             "pytest_add_cli_args_test_selection =", *(f"    {t}" for t in tests),
             "pytest_add_cli_args =", "    -p", "    no:xdist", "    -p", "    no:cacheprovider"]
    (folder / "setup.cfg").write_text("\n".join(lines) + "\n")


def statuses(folder: Path) -> dict[str, str]:
    """Each mutant's status as mutmut recorded it (`mutmut results --all true`)."""
    done = subprocess.run([mutmut(), "results", "--all", "true"], cwd=folder, capture_output=True, text=True,
                          check=True)
    out = {}
    for line in done.stdout.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name:
            out[name] = status
    return out


def equivalent_changes(path: Path = EQUIVALENT) -> set[tuple[str, str]]:
    """The (original line, mutated line) pairs named equivalent: blocks of `# reason`, `- original`, `+ mutated`
    lines, each line stripped."""
    pairs, original = set(), None
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("- "):
            original = line[2:].strip()
        elif line.startswith("+ ") and original is not None:
            pairs.add((original, line[2:].strip()))
            original = None
    return pairs


def change(folder: Path, name: str) -> tuple[str, str]:
    """The line a mutant changes and what it made of it, from `mutmut show`."""
    diff = subprocess.run([mutmut(), "show", name], cwd=folder, capture_output=True, text=True).stdout.splitlines()
    removed = [line[1:].strip() for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff if line.startswith("+") and not line.startswith("+++")]
    return " ".join(removed), " ".join(added)


def mutmut() -> str:
    return str(Path(sys.executable).with_name("mutmut"))


def run_room(room: str, args: argparse.Namespace) -> dict:
    pattern, room_tests = ROOMS[room]
    mutate = [m for m in args.module if Path(m).match(pattern)] if args.module else [pattern]
    if not mutate:
        return {}
    folder = args.workdir / room
    if not args.no_run:
        prepare(folder, mutate, args.tests or room_tests, args.fresh)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        subprocess.run([mutmut(), "run", "--max-children", str(args.max_children), *args.mutant], cwd=folder,
                       env=env, check=False)
    found = statuses(folder)
    counts = {status: sum(1 for s in found.values() if s == status) for status in (KILLED, SURVIVED, TIMEOUT)}
    rest = len(found) - sum(counts.values())
    known = equivalent_changes()
    survivors = {name: change(folder, name) for name, status in sorted(found.items()) if status == SURVIVED}
    equivalent = [name for name, changed in survivors.items() if changed in known]
    counted = len(found) - len(equivalent)
    score = 100.0 * (counts[KILLED] + counts[TIMEOUT]) / counted if counted else float("nan")
    return {"room": room, "modules": ", ".join(mutate), "mutants": len(found), **counts,
            "equivalent": len(equivalent), "other": rest, "score_pct": round(score, 1),
            "survivors": {name: changed for name, changed in survivors.items() if name not in equivalent},
            "folder": str(folder)}


def main() -> None:
    args = parse_args()
    if not Path(mutmut()).exists():
        sys.exit(f"mutmut is not installed beside {sys.executable}: pip install -e '.[dev]'")
    rows = [row for room in (args.room or list(ROOMS)) if (row := run_room(room, args))]
    if not rows:
        sys.exit("no module of the rooms asked was given with --module")
    print("| room | modules | mutants | killed | survived | equivalent | timed out | other | score |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['room']} | {row['modules']} | {row['mutants']} | {row[KILLED]} | {row[SURVIVED]} | "
              f"{row['equivalent']} | {row[TIMEOUT]} | {row['other']} | {row['score_pct']}% |")
    for row in rows:
        if row["survivors"]:
            print(f"\nsurvivors in {row['room']} not named equivalent (`mutmut show NAME` in {row['folder']}):")
            for name, (original, mutated) in row["survivors"].items():
                print(f"  {name}\n    - {original}\n    + {mutated}")
    (args.workdir / "score.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
