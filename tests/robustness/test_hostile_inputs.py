"""Bounded resources and one-line errors: every hostile input to `kernels summarize` and `memory summarize` ends
within 60 s under a 4 GiB address space, with exit 1, one line naming the file and no traceback."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main

KERNELS = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
MIB = 2**20


def gzip_bomb(path, expanded_mb: int):
    """A gzip of a Chrome trace padded with spaces, cut before its end: under 1 KB per expanded MiB."""
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(b'{"traceEvents": [')
        for _ in range(expanded_mb):
            fh.write(b" " * MIB)
    return path


def sparse(path, size: int, head: bytes):
    with open(path, "wb") as fh:
        fh.truncate(size)
        fh.write(head)
    return path


def loop(tmp):
    os.symlink(tmp / "b", tmp / "a")
    os.symlink(tmp / "a", tmp / "b")
    return tmp / "a"


def fifo(tmp):
    os.mkfifo(tmp / "trace.json")
    return tmp / "trace.json"


def snapshot(tmp, obj, name="snap.pickle"):
    (tmp / name).write_bytes(pickle.dumps(obj, protocol=4))
    return tmp / name


def shared_references(tmp):
    """18 KB that stands for nine million blocks: one block, one segment, listed 3,000 times each."""
    block = {"size": 512, "state": "active_allocated"}
    segment = {"address": 0, "total_size": 2**20, "blocks": [block] * 3000}
    return snapshot(tmp, {"segments": [segment] * 3000, "device_traces": [[]]})


def huge_allocation(tmp):
    entry = {"action": "alloc", "addr": 4096, "size": 10**30, "frames": []}
    return snapshot(tmp, {"segments": [], "device_traces": [[entry]]})


def frames_not_a_list(tmp):
    entry = {"action": "alloc", "addr": 4096, "size": 512, "frames": "x"}
    return snapshot(tmp, {"segments": [], "device_traces": [[entry]]})


def without_strings(tmp):
    """A real nsys export with its StringIds table dropped: its kernels' and ranges' names are ids into nothing."""
    path = shutil.copyfile(KERNELS / "h100_tiny_train_bf16.sqlite", tmp / "no_strings.sqlite")
    with sqlite3.connect(path) as con:
        con.execute("DROP TABLE StringIds")
    return path


# case → (command, how to make the input in a temporary folder, a phrase of the one-line error)
CASES = {
    "/dev/zero": ("kernels", lambda tmp: "/dev/zero", "a character device, not a regular file"),
    "FIFO": ("kernels", fifo, "a FIFO (named pipe)"),
    "directory": ("kernels", lambda tmp: tmp, "a directory, not a file"),
    "symlink loop": ("kernels", loop, "a loop of symbolic links"),
    "dangling symlink": ("kernels", lambda tmp: (os.symlink(tmp / "gone", tmp / "l") or tmp / "l"),
                         "a symbolic link to nothing"),
    "1 GiB binary": ("kernels", lambda tmp: sparse(tmp / "big.bin", 2**30, b"\x7fELF"), "binary data"),
    "1 GiB text": ("kernels", lambda tmp: sparse(tmp / "big.txt", 2**30, b"Time (%)" * 1000 + b"\n"),
                   "an input may hold"),
    # A trace is streamed: a bomb of any size passes through in bounded memory, to the end where it is cut.
    "gzip bomb": ("kernels", lambda tmp: gzip_bomb(tmp / "trace.json.gz", 300), "premature EOF"),
    "deep JSON": ("kernels", lambda tmp: (tmp / "t.json").write_text("[" * 100_000 + "]" * 100_000) and tmp / "t.json",
                  "nested deeper"),
    "export without StringIds": ("kernels", without_strings, "ids into a StringIds table it does not have"),
    "snapshot FIFO": ("memory", fifo, "a FIFO (named pipe)"),
    "snapshot with shared references": ("memory", shared_references, "by repeating shared objects"),
    "allocation of 10^30 bytes": ("memory", huge_allocation, "outside 0 to 2^63 - 1"),
    "frames that are not a list": ("memory", frames_not_a_list, "['frames'] is a str"),
}


# Cases that would take the most memory if a bound failed run in a child process under the 4 GiB limit; the
# child's start-up costs seconds, so the others run in this process.
IN_A_CHILD = ("1 GiB binary", "gzip bomb", "snapshot with shared references")


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_input_is_one_line_within_bounds(tmp_path, cli, failure, case):
    command, make, phrase = CASES[case]
    path = make(tmp_path)
    start = time.monotonic()
    if case in IN_A_CHILD:
        line = failure(cli(command, "summarize", path))
    else:
        result = CliRunner().invoke(main, [command, "summarize", str(path)])
        assert result.exit_code == 1 and (result.exception is None or isinstance(result.exception, SystemExit))
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and result.stdout == "", result.output
        line = lines[0]
    assert time.monotonic() - start < 60
    assert phrase in line and str(path) in line


def test_the_input_limit_can_be_raised_and_names_the_reader_that_reads_whole(tmp_path):
    table = sparse(tmp_path / "stats.txt", 3 * MIB, b"Time (%)" * 1000 + b"\n")
    small = CliRunner().invoke(main, ["--max-input-mb", "2", "kernels", "summarize", str(table)])
    assert small.exit_code == 1 and "--max-input-mb" in small.stderr
    assert "an `nsys stats` table is read whole, not streamed" in small.stderr
    raised = CliRunner().invoke(main, ["--max-input-mb", "4", "kernels", "summarize", str(table)])
    # Within the limit the file is read, and found to hold no table.
    assert raised.exit_code == 1 and "an input may hold" not in raised.output


def as_another_user(args: list[str]) -> tuple[int, str]:
    """Exit status and stderr of `profiler-kit ARGS` run by a user other than root: in this process when it is not
    root's, else in a fork that drops to `nobody` (modules imported beforehand, which it could not read)."""
    if os.getuid() != 0:
        result = CliRunner().invoke(main, args)
        return result.exit_code, result.stderr
    for warm_up in (["kernels", "summarize", str(KERNELS / "h100_tiny_train_bf16.sqlite")],
                    ["kernels", "summarize", "--no-such-option"]):  # a usage error imports what errors print with
        CliRunner().invoke(main, warm_up)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, run, report, and never return into pytest
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            result = CliRunner().invoke(main, args)
            os.write(write, json.dumps([result.exit_code, result.stderr]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        text = fh.read()
    os.waitpid(pid, 0)
    code, stderr = json.loads(text)
    return code, stderr


@pytest.mark.parametrize("name", ["h100_tiny_train_bf16.sqlite", "h100_tiny_train_bf16_trace.json.gz"])
def test_an_unreadable_input_exits_1_with_one_line_naming_it(name):
    folder = Path(tempfile.mkdtemp(prefix="unreadable-"))
    try:
        folder.chmod(0o755)  # another user reaches the file, and is refused by the file alone
        report = shutil.copyfile(KERNELS / name, folder / name)
        report.chmod(0)
        code, stderr = as_another_user(["kernels", "summarize", str(report)])
    finally:
        shutil.rmtree(folder)
    lines = stderr.strip().splitlines()
    assert code == 1 and len(lines) == 1, stderr
    assert lines[0] == f"Error: {report}: cannot be read (permission denied)"


def copy_report(tmp_path, sqlite_age_s: float):
    report = shutil.copyfile(KERNELS / "cpu_tiny_train_nsys2022.nsys-rep", tmp_path / "r.nsys-rep")
    sqlite = shutil.copyfile(KERNELS / "cpu_tiny_train_nsys2022.sqlite", tmp_path / "r.sqlite")
    now = time.time()
    os.utime(report, (now, now))
    os.utime(sqlite, (now - sqlite_age_s, now - sqlite_age_s))
    return report, sqlite


def test_a_stale_export_is_never_read_as_current(tmp_path):
    _, sqlite = copy_report(tmp_path, sqlite_age_s=600)
    result = CliRunner().invoke(main, ["kernels", "summarize", str(sqlite)])
    assert result.exit_code == 1 and "export of an earlier recording" in result.stderr


def test_report_without_nsys_points_to_the_export_beside_it(tmp_path, isolated_nsys_search):
    report, sqlite = copy_report(tmp_path, sqlite_age_s=600)
    result = CliRunner().invoke(main, ["kernels", "summarize", str(report)])
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert "nsys export --type sqlite" in line and sqlite.name in line
    assert "--backend" not in line and "--nsys" not in line


def test_report_without_nsys_reads_an_export_copied_just_before_it(tmp_path, isolated_nsys_search):
    report, _ = copy_report(tmp_path, sqlite_age_s=0.5)
    result = CliRunner().invoke(main, ["kernels", "summarize", str(report), "--format", "json"])
    assert result.exit_code == 0, result.output
