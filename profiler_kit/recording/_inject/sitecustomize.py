"""Loaded by every Python process that `profiler-kit nsys -- COMMAND` or `memory -- COMMAND` starts (this folder
leads PYTHONPATH): sets up the recorder that the parent asked for, so the program needs no change."""

import os
import sys

if os.environ.get("PROFILER_KIT_RECORD"):
    try:
        from profiler_kit.recording.child import install_from_environment

        install_from_environment(os.environ)
    except Exception as exc:  # the program must run even when recording cannot be set up in this process
        print(f"profiler-kit: no recording in this process: {type(exc).__name__}: {exc}", file=sys.stderr)
