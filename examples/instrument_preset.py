"""Per-block ranges for a model you did not write: the built-in Transformer presets, instrumented from outside.

    profiler-kit nsys --phase layers.0.forward --phase layers.0.backward -- \\
        python examples/instrument_preset.py --model xl --ctx 256 --mixed-precision

`profiler_kit.instrument` puts `layers.N.forward` and `layers.N.backward` around every block by module hooks,
so each block's backward kernels, which PyTorch's autograd thread launches, get a range of their own.
"""

from __future__ import annotations

import argparse

import profiler_kit
from profiler_kit.workload import Workload, WorkloadConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--ctx", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--mixed-precision", action="store_true")
    parser.add_argument("--depth", type=int, default=2, help="layers is depth 1, layers.0 depth 2")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()

    cap = profiler_kit.capture(warmup=args.warmup, steps=args.steps)  # before the first CUDA call
    workload = Workload(WorkloadConfig(args.model, args.ctx, "train", args.batch_size, args.mixed_precision))
    profiler_kit.instrument(workload.model, depth=args.depth)
    with cap:
        for _ in range(args.warmup + args.steps):
            with cap.step():
                workload.step()


if __name__ == "__main__":
    main()
