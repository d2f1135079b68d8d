"""The folder `profiler-kit nsys -- COMMAND` puts first on PYTHONPATH: its `sitecustomize` sets up recording
in the profiled program. A package only so that installs ship it."""
