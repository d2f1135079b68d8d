"""profiler-kit: where the time and memory of a Transformer LM training step go on an NVIDIA GPU."""

__version__ = "0.1.0"
