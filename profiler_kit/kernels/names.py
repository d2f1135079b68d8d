"""Kernel names folded to what a kernel computes, so that two reports' kernels can be matched.

A kernel's demangled name carries launch details that change between runs of the same model: the dtype of its
template arguments (fp32 vs bf16), vector widths and block sizes, tile shapes of cuBLAS kernels, the numbered
suffix of a Triton kernel, the library's choice of GEMM kernel. `normalize` removes them and keeps the operation:
`void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, std::array<char *,
(unsigned long)3>>(int, T2, T3)` and `void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<
c10::BFloat16>, ...>(...)` both become `at::native::elementwise_kernel<at::native::CUDAFunctor_add<T>>`, and
every cuBLAS/cuBLASLt/CUTLASS GEMM becomes `GEMM (cuBLAS)`.

`match` lines two per-name tables up by normalized name: per key, A and B time, the delta, the names on each
side (shown when they differ) and whether the key is new in B or vanished from it.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profiler_kit.kernels.categories import MATCHED_CHARS

GEMM = "GEMM (cuBLAS)"
# Library GEMMs: which kernel cuBLAS picks depends on dtype, shape and GPU, so all of them are one operation.
_GEMM = re.compile(r"nvjet|xmma_gemm|sgemm|hgemm|gemm_kernel|gemmSN|cutlass.*gemm|gemv|ampere_.*gemm|sm\d+_.*gemm",
                   re.IGNORECASE)
_SPLIT_K = re.compile(r"splitKreduce", re.IGNORECASE)
_TYPES = re.compile(
    r"\b(?:c10::BFloat16|c10::Half|c10::complex<\w+>|__nv_bfloat16|__half|at::BFloat16|at::Half|half|float|"
    r"double|bool|(?:unsigned\s+)?(?:long\s+long|long|int|short|char)|int\d+_t|uint\d+_t|size_t)\b"
)
# Dtypes spelled inside identifiers (ncclDevKernel_AllReduce_Sum_f32_RING_LL, triton_..._bf16).
_DTYPE_WORDS = re.compile(r"(?<=_)(?:f8|f16|bf16|f32|f64|fp8|fp16|fp32|fp64|e4m3|e5m2|half|float|bfloat16)(?=_|$)")
_CASTS = re.compile(r"\((?:unsigned )?T\)")
# Numbers that stand alone (not part of an identifier such as c10 or bfloat16), and a trailing `_<n>` suffix.
_NUMBERS = re.compile(r"(?<![A-Za-z0-9_])\d+(?:\.\d+)?[uUlLfF]*|(?<=_)\d+$")
_ELEMENTWISE = re.compile(r"\b(?:vectorized_|unrolled_)?elementwise_kernel<")
_KERNEL_IMPL = re.compile(r"gpu_kernel_impl(?:_nocast)?<")
_SPACES = re.compile(r"\s+")


def _strip_parameters(name: str) -> str:
    """The name without its trailing function parameter list `(...)`, when it has one."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            # A parameter list follows a template's `>` or an identifier.
            before = name[i - 1] if i > 0 else ""
            return name[:i] if before == ">" or before.isalnum() or before == "_" else name
    return name


def _template_args(text: str, open_at: int) -> list[str]:
    """The top-level arguments of the template whose `<` is at `open_at`."""
    args, depth, begin = [], 0, open_at + 1
    for i in range(open_at, len(text)):
        char = text[i]
        if char in "<([":
            depth += 1
        elif char in ">)]":
            depth -= 1
            if depth == 0:
                args.append(text[begin:i].strip())
                return args
        elif char == "," and depth == 1:
            args.append(text[begin:i].strip())
            begin = i + 1
    return args


def _first_template_arg(text: str, found: re.Match) -> str:
    """The first argument of a template that is not a number (launch parameters such as vector widths)."""
    args = [arg for arg in _template_args(text, found.end() - 1) if arg != "N"]
    return args[0].removeprefix("void ") if args else ""


def normalize(name: str) -> str:
    """What the kernel computes, without dtypes, sizes, tile shapes or numbered suffixes; folded from the name's
    first MATCHED_CHARS characters, as categories are."""
    text = name[:MATCHED_CHARS].strip().removeprefix("void ")
    if _SPLIT_K.search(text):
        return f"{GEMM} split-K reduction"
    if _GEMM.search(text):
        return GEMM
    text = _strip_parameters(text)
    text = _TYPES.sub("T", text)
    text = _DTYPE_WORDS.sub("T", text)
    text = _NUMBERS.sub("N", text)
    text = _CASTS.sub("", text)
    text = text.replace("(instance N)", "")
    elementwise = _ELEMENTWISE.search(text)
    if elementwise:
        # The launcher (vectorized, unrolled, generic) and its loaders are launch details; the functor is the op.
        functor = _first_template_arg(text, elementwise)
        impl = _KERNEL_IMPL.search(functor)
        if impl:
            functor = _first_template_arg(functor, impl)
        if "[lambda" in functor:  # a lambda is named by the function that defines it
            functor = functor.split("(", 1)[0]
        text = f"{text[:elementwise.start()]}elementwise_kernel<{functor}>"
    return _SPACES.sub(" ", text).strip()


MATCH_COLUMNS = ("kernel", "category", "a_ns", "b_ns", "status", "a_names", "b_names")


def normalized(names: pd.Series) -> pd.Series:
    """`normalize` of each name, each distinct name folded once."""
    codes, uniques = pd.factorize(names.astype(str))
    return pd.Series(np.asarray([normalize(n) for n in uniques], dtype=object)[codes], index=names.index)


def match(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per normalized name (from per-name tables with `name`, `category`, `total_ns`): A and B time, `status`
    (both, new, vanished) and the distinct names on each side, largest |B − A| first."""
    sides = []
    for frame, side in ((a, "a"), (b, "b")):
        keyed = frame.assign(kernel=normalized(frame["name"]))
        grouped = keyed.groupby("kernel", sort=False).agg(
            category=("category", "first"), total_ns=("total_ns", "sum"),
            names=("name", lambda names: sorted(set(map(str, names)))),
        )
        sides.append(grouped.add_prefix(f"{side}_"))
    table = sides[0].join(sides[1], how="outer")
    out = pd.DataFrame({
        "kernel": table.index.astype(str),
        "category": table["a_category"].fillna(table["b_category"]).astype(str).to_numpy(),
        "a_ns": table["a_total_ns"].fillna(0).astype(np.int64).to_numpy(),
        "b_ns": table["b_total_ns"].fillna(0).astype(np.int64).to_numpy(),
        "status": np.select([table["a_total_ns"].isna(), table["b_total_ns"].isna()], ["new", "vanished"], "both"),
        "a_names": [n if isinstance(n, list) else [] for n in table["a_names"]],
        "b_names": [n if isinstance(n, list) else [] for n in table["b_names"]],
    })
    delta = out["b_ns"].to_numpy() - out["a_ns"].to_numpy()
    order = np.lexsort((out["kernel"].to_numpy(), -np.abs(delta)))
    return out.iloc[order].reset_index(drop=True)


def top_movers(matched: pd.DataFrame, explain: float = 0.9, at_least: int = 1) -> pd.DataFrame:
    """The fewest rows of `matched` (largest |B − A| first) whose deltas add up to within 1 − `explain` of the
    total delta, and at least `at_least` rows."""
    deltas = (matched["b_ns"] - matched["a_ns"]).to_numpy()
    total = deltas.sum()
    close = np.abs(total - np.cumsum(deltas)) <= (1 - explain) * abs(total)
    count = int(np.argmax(close)) + 1 if close.any() else len(matched)
    return matched.head(max(count, min(at_least, len(matched))))
