"""What kind of work a GPU kernel does, from its name alone: one ordered rule table, first match wins.

Order matters because names overlap: NCCL kernels say `Reduce`, cuDNN's fused attention kernels say `wgmma`
(a matmul instruction), `elementwise_kernel`s that only copy or cast name `direct_copy_kernel_cuda`, and
foreach optimizer kernels wrap elementwise functors. So communication comes first, then attention, the
optimizer, normalization and softmax, then matmul, and the catch-all elementwise last before `other`.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

CATEGORIES: tuple[str, ...] = (
    "matmul",
    "attention",
    "elementwise",
    "reduction",
    "normalization",
    "softmax",
    "optimizer",
    "copy",
    "communication",
    "other",
)
OTHER = "other"

RULES: tuple[tuple[str, str], ...] = (
    # NCCL and custom all-reduce kernels; before reduction, whose words they share.
    ("communication", r"nccl|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"),
    # FlashAttention (Dao's, PyTorch's copy, ours: `_flash_attn_*`/`_attn_*`), memory-efficient attention
    # (`fmha_cutlass*`), cuDNN SDPA (`cudnn_generated_fort_native_sdpa_*`, names that contain `wgmma`) and the
    # helper kernels of its backward pass (`dot_do_o`, `convert_dq`).
    ("attention", r"flash|fmha|sdpa|attention|attn|(?:^|[^a-z])mha|dot_do_o|convert_dq|dq_convert"),
    # torch.optim foreach/fused steps run as multi_tensor_apply kernels; apex/DeepSpeed fused Adam/LAMB.
    ("optimizer", r"multi_tensor_apply|fused_?adam|adam_?kernel|lamb_?kernel|_foreach_"),
    ("normalization", r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|gammabeta"),
    ("softmax", r"softmax"),
    # cuBLAS/cuBLASLt (incl. Hopper's `nvjet_*` and `splitKreduce`), CUTLASS, xmma/wgmma, Triton/Inductor
    # matmul templates (`triton_tem_*`, `*_mm_*`).
    ("matmul", r"gemm|gemv|nvjet|cutlass|xmma|wgmma|cublas|matmul|triton_tem_|(?:^|[^a-z])b?mm(?:_|\d|$)"),
    # ATen reduce_kernel, cub reductions, Inductor reductions (`triton_red_*`, persistent `triton_per_*`).
    ("reduction", r"reduce|reduction|triton_red_|triton_per_|argmax|argmin"),
    # Data movement and dtype casts, including the elementwise kernels that only copy.
    ("copy", r"copy|transpose|gather|scatter|index_?select|embedding|catarray|permute"),
    # ATen elementwise/vectorized kernels, Inductor pointwise kernels, fills and masks.
    ("elementwise", r"elementwise|pointwise|triton_poi_|fill|triu_tril|where_kernel|dropout"),
)
_COMPILED = tuple((category, re.compile(pattern, re.IGNORECASE)) for category, pattern in RULES)


def category_of(name: str) -> str:
    """The category of one kernel name."""
    return next((category for category, rx in _COMPILED if rx.search(name)), OTHER)


def categorize(names: pd.Series) -> pd.Categorical:
    """Categories of many kernel names, a Categorical over CATEGORIES; each distinct name is matched once."""
    as_categorical = names.astype("category")
    per_name = [CATEGORIES.index(category_of(str(name))) for name in as_categorical.cat.categories]
    codes = np.asarray(per_name, dtype=np.int64)[as_categorical.cat.codes.to_numpy()]
    return pd.Categorical.from_codes(codes, categories=list(CATEGORIES))
