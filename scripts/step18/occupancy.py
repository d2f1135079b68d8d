"""Issue 6, step 18: blocks per SM of each fused variant's compiled kernel (the driver's occupancy query).

Usage (GPU machine, repository root): python3 scripts/step18/occupancy.py FILE.py:STAGES ...
"""

from __future__ import annotations

import ctypes
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flash_fused_sink import backward_with, load_variant  # noqa: E402

from profiler_kit.attention.flash_triton_fwd import flash_forward  # noqa: E402


def main() -> int:
    cuda = ctypes.CDLL("libcuda.so.1")
    q, k, v, do = (torch.randn(1, 2, 1000, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = flash_forward(q, k, v, True)
    workdir = Path(tempfile.mkdtemp())
    for i, arg in enumerate(sys.argv[1:]):
        path, stages = arg.rsplit(":", 1)
        module = load_variant(Path(path).read_text(), f"occupancy_{i}", workdir)
        backward_with(module, q, k, v, out, lse, do, True,
                      gluon_fused=dict(block_m=64, block_n=64, stages=int(stages), num_warps=4))
        torch.cuda.synchronize()
        for cache in module._fused_kernel.device_caches.values():
            kernels = next(c for c in cache if isinstance(c, dict) and c)  # the compiled kernels, by key
            for compiled in kernels.values():
                compiled._init_handles()
                blocks = ctypes.c_int()
                rc = cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    ctypes.byref(blocks), ctypes.c_void_p(compiled.function), 128,
                    ctypes.c_size_t(compiled.metadata.shared))
                print(f"{Path(path).name} stages {stages}: regs {compiled.n_regs} spills {compiled.n_spills} "
                      f"smem {compiled.metadata.shared} blocks/SM {blocks.value} (rc {rc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
