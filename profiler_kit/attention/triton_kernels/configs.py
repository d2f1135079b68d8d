"""Which configs the Triton attention kernels are offered and how a config is described.

Configs are written as (BLOCK_M, BLOCK_N, warps, stages, *flags) tuples (`configs`); the lists per kernel are
most preferred first, so that without autotuning the first one that fits runs. The pruner keeps those that fit
in shared memory and drops flags where they do not compile or cannot help (`ws_allowed`, `regs_allowed`,
`head_first_wanted`). `tools/flash_tune.py` times every candidate; docs/attention.md has the
timings that chose the lists.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import triton

# Scores are kept in base-2 units: the softmax scale 1/√d is folded into log2(e).
LOG2E = math.log2(math.e)
# Shared memory one block may use on H100 (227 KiB); configs estimated above it are not compiled at all.
SMEM_BUDGET_BYTES = 227 * 1024
TUNING_KEY = ["HEAD_DIM", "CAUSAL", "TMA", "SEQ_BUCKET"]
# Sequence lengths up to this share one tuning (short calls are dominated by launch overhead anyway);
# lengths past the cap reuse the cap's tuning.
SEQ_BUCKET_MIN = 1024
SEQ_BUCKET_MAX = 16384


def seq_bucket(n: int) -> int:
    """The autotune bucket of a sequence length: a power of two in [SEQ_BUCKET_MIN, SEQ_BUCKET_MAX]."""
    return min(triton.next_power_of_2(max(n, SEQ_BUCKET_MIN)), SEQ_BUCKET_MAX)


def block_d(head_dim: int) -> int:
    """The tile's head dim: the next power of two ≥ d (tl.arange and tl.dot need powers of two ≥ 16)."""
    return max(triton.next_power_of_2(head_dim), 16)


def ws_allowed(elem_bytes: int, head_dim: int, tma: bool) -> bool:
    """Where warp-specialised configs are offered: 16-bit, d = 128, TMA loads, the one case where they compile
    and can win. Elsewhere they are pruned, because a config that fails to compile would end the autotuner's
    run instead of losing to the others."""
    return elem_bytes == 2 and head_dim == 128 and tma


def regs_allowed(head_dim: int) -> bool:
    """Where configs with the "regs" flag (resident tiles in registers) are offered: d ≤ 64. At d = 128 the
    dK/dV kernel's K and V would take 64 more registers per thread and spill."""
    return head_dim <= 64


def head_first_wanted(head_dim: int, causal: bool) -> bool:
    """The grid order of the forward and dQ kernels: head-first (the longest causal tiles of all heads start
    first) causal at d ≤ 64, and tiles first elsewhere, where programs that run together share K and V in the
    L2. One order per shape, because twins in both orders time alike in a short sweep and not when sustained
    (docs/attention.md)."""
    return causal and head_dim <= 64


# Heads per group of a causal launch's tiles-first grid (`tiles.grid_position`): enough heads that the short
# causal tiles of one head fill in behind the long ones of the others, few enough that their K and V stay in L2.
CAUSAL_HEAD_GROUP = 4


def head_group(causal: bool) -> int:
    """The HEAD_GROUP constexpr of the tiled kernels: CAUSAL_HEAD_GROUP when causal, else 1 (every program of a
    non-causal launch does the same work, so one head after another loses nothing and shares the most L2)."""
    return CAUSAL_HEAD_GROUP if causal else 1


def smem_pruner(resident: tuple[str, ...], streamed: tuple[str, ...], order_by_shape: bool = False) -> Callable:
    """An `early_config_prune` keeping the configs whose tiles fit in SMEM_BUDGET_BYTES (warp-specialised
    ones only where `ws_allowed`, "regs" ones only where `regs_allowed`; with `order_by_shape`, only those on
    the grid order `head_first_wanted` picks, where the list offers any).

    `resident` names the block sizes of the (rows × BLOCK_D) tiles a program loads once, `streamed` those the
    pipeliner keeps `num_stages` copies of. For these kernels the estimate equals Triton's allocation for the
    forward and over-counts the backward a little; Triton rejects (OutOfResources) whatever slips through.
    """

    def smem_bytes(config: triton.Config, elem: int, width: int) -> int:
        once = sum(config.kwargs[r] for r in resident)
        pipelined = config.num_stages * sum(config.kwargs[r] for r in streamed)
        return (once + pipelined) * width * elem

    def prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
        elem, width = named_args["Q"].element_size(), block_d(kwargs["HEAD_DIM"])
        if not ws_allowed(elem, kwargs["HEAD_DIM"], kwargs["TMA"]):
            configs = [c for c in configs if not c.kwargs["WS"]]
        if not regs_allowed(kwargs["HEAD_DIM"]):
            configs = [c for c in configs if not c.kwargs["REGS"]]
        if order_by_shape:
            wanted = head_first_wanted(kwargs["HEAD_DIM"], kwargs["CAUSAL"])
            configs = [c for c in configs if c.kwargs["HEAD_FIRST"] == wanted] or configs
        kept = [c for c in configs if smem_bytes(c, elem, width) <= SMEM_BUDGET_BYTES]
        # The autotuner refuses an empty list: fall back to the smallest config.
        return kept or [min(configs, key=lambda c: smem_bytes(c, elem, width))]

    return prune


# Each descriptor argument's block is (1, 1, rows, BLOCK_D), with rows the block size named here; the
# descriptors of (Z·H, seq) per-row statistics take blocks of (1, rows).
DESCRIPTOR_ROWS = {"DESC_Q": "BLOCK_M", "DESC_O": "BLOCK_M", "DESC_DO": "BLOCK_M", "DESC_K": "BLOCK_N",
                    "DESC_V": "BLOCK_N", "DESC_LSE2": "BLOCK_M", "DESC_DELTA": "BLOCK_M"}


def size_descriptors(nargs: dict) -> None:
    """Give the TMA descriptors among a launch's arguments the block shape of the config about to run.

    A config pre_hook: the descriptors are made once per call, before the autotuner picks block sizes.
    """
    for name, rows in DESCRIPTOR_ROWS.items():
        desc = nargs.get(name)
        if desc is not None:
            desc.block_shape = [1, nargs[rows]] if len(desc.shape) == 2 else [1, 1, nargs[rows], nargs["BLOCK_D"]]


# The config flags a shape tuple may name, and the constexpr each one sets (all off unless named).
CONFIG_FLAGS = {"ws": "WS", "head_first": "HEAD_FIRST", "overlap": "OVERLAP", "regs": "REGS"}


def configs(shapes: list[tuple], params: list[str]) -> list[triton.Config]:
    """Autotune configs from (BLOCK_M, BLOCK_N, warps, stages, *flags) tuples for a kernel with parameters
    `params`; flags are names of `CONFIG_FLAGS` whose constexpr the kernel declares, and each such constexpr
    the kernel declares is set (off unless named). A flag "maxnreg=R" caps the registers per thread at R, so
    that more blocks fit on an SM, at the price of spills.

    "ws" (warp specialisation) splits a key/query loop between producer warps issuing the loads and consumer
    warps doing the math, where Triton can partition it. "head_first" launches a (Z·H, tiles) grid instead
    of (tiles, Z·H), so that the longest causal tiles of all heads start before any shorter one (see
    `tile_program`). "overlap" issues a matmul that does not depend on the exp2 before it, so that the
    tensor cores work while the exp2 runs (the dK/dV kernel's OVERLAP says which matmul). "regs" feeds the
    matmuls of the resident tiles (q; k and v; q and dO) from registers, not shared memory (see
    `tiles.register_operand`).
    """
    known = {name: const for name, const in CONFIG_FLAGS.items() if const in params}
    out = []
    for m, n, w, s, *flags in shapes:
        caps = [f for f in flags if isinstance(f, str) and f.startswith("maxnreg=")]
        flags = [f for f in flags if f not in caps]
        unknown = set(flags) - set(known)
        if unknown:
            raise ValueError(f"config flags {sorted(unknown, key=str)} not offered here; known: {sorted(known)}")
        switches = {const: name in flags for name, const in known.items()}
        out.append(triton.Config({"BLOCK_M": m, "BLOCK_N": n, **switches}, num_warps=w, num_stages=s,
                                 maxnreg=int(caps[-1].split("=")[1]) if caps else None, pre_hook=size_descriptors))
    return out


def grid_2d(tiles: int, heads: int, meta: dict) -> tuple[int, int]:
    """The launch grid of a kernel with `tiles` tiles per batch·head, in the order the config asks for."""
    return (heads, tiles) if meta.get("HEAD_FIRST") else (tiles, heads)


def describe(config: triton.Config) -> str:
    """A config in one phrase: "128x64 w8 s3", then its flags ("ws", "head-first", "overlap", "regs") and a
    register cap ("maxnreg=R")."""
    kwargs = config.kwargs
    return (f"{kwargs['BLOCK_M']}x{kwargs['BLOCK_N']} w{config.num_warps} s{config.num_stages}"
            + "".join(f" {flag.replace('_', '-')}" for flag, const in CONFIG_FLAGS.items() if kwargs.get(const))
            + (f" maxnreg={config.maxnreg}" if config.maxnreg else ""))


# Forward: 128-row query tiles keep the tensor cores busy and 8 warps hold 128×128 score tiles and d = 128
# accumulators without spilling; the two-stage and 64-row configs keep fp32 at d = 128 within shared memory.
# The head-first one is offered alone where `head_first_wanted` and dropped elsewhere.
FWD_SHAPES = [
    (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 64, 8, 3, "head_first", "regs"),
    (64, 64, 4, 3), (128, 64, 4, 3), (128, 64, 4, 2), (64, 64, 4, 2),
]
# dK/dV: a key tile stays resident while query tiles stream by (one size divides the other). The tuned winners
# come first (the "overlap" schedule; 64×64 tiles with 2 stages fit two blocks per SM at d = 128, helped by a
# register cap), then smaller tiles that keep fp32 at d = 128 within shared memory.
DKDV_SHAPES = [
    (64, 64, 4, 4, "overlap", "regs"), (64, 64, 4, 3, "overlap", "regs"),
    (64, 128, 8, 3, "overlap"), (64, 128, 8, 2, "overlap"), (64, 128, 8, 3, "ws", "overlap"),
    (64, 64, 4, 3, "overlap"), (64, 64, 4, 4, "overlap"), (32, 128, 4, 3, "head_first", "overlap"),
    (64, 64, 4, 2, "overlap"), (64, 64, 4, 2, "overlap", "maxnreg=168"),
    (64, 128, 8, 3), (64, 128, 8, 2), (64, 128, 8, 4), (64, 64, 4, 4),
    (32, 128, 8, 3), (32, 128, 4, 3), (32, 64, 4, 3), (32, 64, 4, 2),
]
# dQ: the mirror image, a query tile resident and key tiles streamed (BLOCK_M % BLOCK_N == 0).
DQ_SHAPES = [
    (128, 64, 8, 3), (128, 64, 8, 4), (128, 64, 8, 4, "ws"), (128, 64, 4, 3), (128, 64, 4, 3, "head_first"),
    (128, 64, 4, 4), (128, 32, 4, 3), (128, 32, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3), (64, 32, 4, 2),
]
