"""The recording room's place in the package, read from the source (every import, also those inside functions):
nothing it builds on imports it back, only the command line and the package's face import it, no import cycle
runs through it, and the runner's side of a recording (the parent process) never loads torch."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "profiler_kit"
ROOM = "profiler_kit.recording"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module of the package → the package's modules it imports, anywhere in its source (importing
    `a.b.c` runs `a.b` first: the packages above an imported module count as imported too)."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                            else node.module for alias in node.names}
        targets |= {target.rsplit(".", depth)[0] for target in set(targets) for depth in range(1, target.count("."))}
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def _in_room(module: str) -> bool:
    return module == ROOM or module.startswith(ROOM + ".")


def reachable(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_nothing_the_recording_room_builds_on_imports_it():
    graph = import_graph()
    room = {module for module in graph if _in_room(module)}
    below = reachable(graph, room) - room - {"profiler_kit"}  # the package's facade loads `api` on first use
    assert "profiler_kit.nvtx_ranges" in below and "profiler_kit.names" in below
    offenders = {module: sorted(filter(_in_room, graph[module])) for module in below}
    assert {module: targets for module, targets in offenders.items() if targets} == {}
    # The model and the workload, which the recorded programs run, are below it too.
    assert {"profiler_kit.model", "profiler_kit.workload"} <= below


def test_only_the_command_line_and_the_package_face_import_the_recording_room():
    graph = import_graph()
    above = {module for module in graph if module in ("profiler_kit", "profiler_kit.cli")
             or module.startswith("profiler_kit.cli.")}
    importers = {module for module, targets in graph.items()
                 if not _in_room(module) and any(map(_in_room, targets))}
    assert importers and importers <= above, sorted(importers - above)


def test_no_import_cycle_runs_through_the_recording_room():
    graph = import_graph()
    for module in filter(_in_room, graph):
        assert module not in reachable(graph, {module}), f"{module} imports itself back"


def test_the_runners_side_never_loads_torch(tmp_path, fake_nsys):
    """A run under each backend, from a process that imports only the runner: torch is never loaded there."""
    script = tmp_path / "prog.py"
    script.write_text("print('hello')\n")
    nsys = fake_nsys("exit 0")
    code = f"""
import json, sys
from profiler_kit.errors import ProfilerKitError
from profiler_kit.recording.runner import run_program
said = {{}}
for backend, options in (("torch", {{}}), ("nsys", {{"nsys_path": {str(nsys)!r}}}), ("memory", {{"max_entries": 9}})):
    try:
        said[backend] = run_program([sys.executable, {str(script)!r}], backend, {str(tmp_path)!r} + "/" + backend,
                                    **options).exit_code
    except ProfilerKitError as exc:
        said[backend] = str(exc)
said["torch loaded"] = "torch" in sys.modules
print(json.dumps(said))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=PACKAGE.parent)
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["torch loaded"] is False, said
    assert said["torch"] == 0 and "nsys made no report" in said["nsys"]
    assert said["memory"] == "CUDA memory history needs a CUDA device" or said["memory"] == 0
