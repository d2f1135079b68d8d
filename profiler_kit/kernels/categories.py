"""What kind of work a GPU kernel (or, in a trace without kernels, a CPU operator) does, from its name alone:
one ordered rule table per kind, first match wins.

Order matters because names overlap: NCCL kernels say `Reduce`, cuDNN's fused attention kernels say `wgmma`
(a matmul instruction), `elementwise_kernel`s that only copy or cast name `direct_copy_kernel_cuda`, and
foreach optimizer kernels wrap elementwise functors. So communication comes first, then attention, the
optimizer, normalization and softmax, then matmul, and the catch-all elementwise last before `other`.

Names alone miss an optimizer written as a for-loop (`aten::mul_`, `lerp_`, `addcdiv_` per parameter): where
a trace has PyTorch's `Optimizer.step#…` ranges (OPTIMIZER_STEP), the work launched inside them is optimizer work
(`labels` says so).
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
    # torch.optim foreach/fused steps run as multi_tensor_apply kernels; apex/DeepSpeed fused Adam/LAMB; our
    # master-weight AdamW (`_adamw_master_kernel`).
    ("optimizer", r"multi_tensor_apply|fused_?adam|adamw?_(?:\w*_)?kernel|lamb_?kernel|_foreach_"),
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
# PyTorch operators (`aten::mm`, `c10d::allreduce_`) as a torch.profiler trace of a CPU run names them. Their
# self time is what is categorized, so wrappers (`aten::linear`, autograd's `evaluate_function`) keep only the
# little time they spend themselves.
CPU_RULES: tuple[tuple[str, str], ...] = (
    ("communication", r"c10d|gloo|nccl|all_?reduce|all_?gather|reduce_?scatter|broadcast|all_?to_?all|barrier"
                      r"|record_param_comms"),
    ("attention", r"scaled_dot_product|flash|attention"),
    ("optimizer", r"_foreach_|fused_adam|adamw?_|_fused_sgd|optimizer"),
    ("normalization", r"layer_norm|rms_norm|batch_norm|group_norm|instance_norm"),
    ("softmax", r"softmax"),
    ("matmul", r"::(?:mm|addmm|bmm|baddbmm|addbmm|matmul|linear|einsum|dot|mv|addmv|_addmm_activation"
               r"|convolution|_convolution|conv\dd|mkldnn_\w+)$"),
    ("reduction", r"::(?:sum|mean|max|min|amax|amin|argmax|argmin|norm|linalg_vector_norm|var|std|logsumexp"
                  r"|cumsum|prod|nll_loss\w*|cross_entropy\w*)$"),
    ("copy", r"::(?:copy_|_to_copy|to|clone|contiguous|cat|stack|index\w*|gather|scatter\w*|embedding\w*"
             r"|transpose|permute|_unsafe_view|view|reshape|t|expand|slice|select|narrow|split|chunk|unbind"
             r"|flatten|squeeze|unsqueeze|as_strided|detach|empty\w*|resize_|new_\w+)$"),
    ("elementwise", r"_backward$|::(?:add|sub|mul|div|neg|pow|sqrt|rsqrt|exp|log|tanh|sigmoid|relu|gelu|silu"
                    r"|where|fill|zero|ones|masked_fill|dropout|lerp|addcmul|addcdiv|clamp|abs|sign|rand"
                    r"|bernoulli|threshold|eq|ne|lt|gt|le|ge|maximum|minimum|reciprocal|square|sin|cos|triu"
                    r"|tril)"),
)


def _compile(rules: tuple[tuple[str, str], ...]) -> tuple[tuple[str, re.Pattern], ...]:
    return tuple((category, re.compile(pattern, re.IGNORECASE)) for category, pattern in rules)


OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
COMMUNICATION = "communication"
_COMPILED = {"kernel": _compile(RULES), "cpu_op": _compile(CPU_RULES)}
KINDS = tuple(_COMPILED)
# Rules are matched against the start of a name this long: real names (C++ signatures) are far shorter, and
# a regular expression searched through a name of megabytes takes minutes.
MATCHED_CHARS = 65_536


def category_of(name: str, kind: str = "kernel") -> str:
    """The category of one kernel name (`kind` kernel) or CPU operator name (`kind` cpu_op)."""
    return next((category for category, rx in _COMPILED[kind] if rx.search(name, 0, MATCHED_CHARS)), OTHER)


def categorize(names: pd.Series, kind: str = "kernel") -> pd.Categorical:
    """Categories of many names, a Categorical over CATEGORIES; each distinct name is matched once."""
    as_categorical = names.astype("category")
    per_name = [CATEGORIES.index(category_of(str(name), kind)) for name in as_categorical.cat.categories]
    codes = np.asarray(per_name, dtype=np.int64)[as_categorical.cat.codes.to_numpy()]
    return pd.Categorical.from_codes(codes, categories=list(CATEGORIES))
