"""Everything that runs a program under a recorder (Nsight Systems or torch.profiler), one path for all:
`runner` starts the program, `child` and `mirror` set recording up inside it (through `_inject`), `api` and
`ranges` are what the program marks itself with, `nsys` drives Nsight Systems, and the built-in workload is
one more program (`targets`, started by `builtin`)."""
