"""Everything that runs a program under a recorder (Nsight Systems, torch.profiler or the CUDA memory history),
one path for all: `runner` starts the program (the parent side, which never loads torch, and drives Nsight Systems
through `nsys_tool`) and reads what it said (`channel`); inside the program `child` sets up, in one place through
`_inject`, the automatic marks (`marks`), the window and step clock (`window`), the mirrors of the program's ranges
(`mirror`), the guard and its notes (`notes`) and the recorder (`recorders`, `history`); `api` is what a program
marks itself with; the built-in workload is one more program (`targets`, started by `builtin`). Modules below this
room (`nvtx_ranges`, `names`, `nsys_tool`, the model, the workload, the analyses) never import it; only the command
line and the package's face (`profiler_kit.phase`, `capture`, `instrument`) stand above it."""
