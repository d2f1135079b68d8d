"""What every JSON document says about where it was made: `schema_version` and an `environment` block.

Versions are read without side effects: torch's from package metadata unless it is already imported, the GPU
only when this process has initialised CUDA, nsys only when a command of this run used it (`note`).
"""

from __future__ import annotations

import platform
import sys
from typing import Any

# profiler-kit's own version (pyproject.toml's), which `profiler_kit.__version__` and `--version` give.
VERSION = "0.1.0"
# Bumped when a field of a JSON document changes meaning or goes away; new fields keep it.
SCHEMA_VERSION = 1
_noted: dict[str, str] = {}


def note(tool: str, version: str) -> None:
    """Record the version of a tool this run used (nsys), for `environment()`."""
    _noted[tool] = version


def _package_version(name: str) -> str | None:
    import importlib.metadata  # tens of milliseconds: only when a document is written

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    cuda = gpu = None
    if torch is not None:
        cuda = torch.version.cuda
        if torch.cuda.is_initialized():
            gpu = torch.cuda.get_device_name()
    return {
        "profiler_kit": VERSION,
        "python": platform.python_version(),
        "torch": torch.__version__ if torch is not None else _package_version("torch"),
        "cuda": cuda,
        "gpu": gpu,
        "nsys": _noted.get("nsys"),
    }


def envelope(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with `schema_version` and `environment` first."""
    return {"schema_version": SCHEMA_VERSION, "environment": environment(), **obj}
