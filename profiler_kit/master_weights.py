"""AdamW on fp32 master weights for a model that holds its weights in bf16 (`--optimizer adamw-master`).

Under bf16 autocast with fp32 weights, each step casts every weight to bf16 in the forward (a compiled backward
casts it again) and turns every bf16 weight gradient into fp32. Here the model's parameters are bf16 tensors, so
its matmuls take them as they are and its gradients come out in bf16; the optimizer keeps the fp32 copies, the
master weights, with both AdamW moments in flat fp32 buffers. One Triton kernel per step reads each bf16
gradient with the master weight and the moments, and writes the master weight, the moments and the bf16 weight:
28 bytes per parameter, as many as torch's fused fp32 AdamW moves, and no cast anywhere else.

The kernel finds the gradients through a table of their addresses, made anew each step (autograd allocates new
gradient tensors, shaped and strided like their contiguous parameters), and the bf16 weights through a fixed
one: the parameters must stay where they are. Each program updates one chunk of `BLOCK` elements
of one parameter. On a CPU without the Triton interpreter the same update runs as PyTorch ops, parameter by
parameter.

The step may be captured in a CUDA graph: the step count lives on the device (the kernel reads the powers of
the betas that a replay computes from it), and while a capture runs the gradients' addresses, which a graph's
replays keep, go to a table of the optimizer's own that `write_captured_tables` fills once the capture ends.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import triton
import triton.language as tl

from profiler_kit.attention.options import INTERPRET

# Elements per program: the update is memory-bound, and a large chunk amortises each program's table reads.
BLOCK = 4096
NUM_WARPS = 8
# Each parameter starts its slice of the flat buffers at a multiple of this many elements (64 bytes of fp32),
# so the kernel may assume aligned, vectorisable accesses.
ALIGN: tl.constexpr = tl.constexpr(16)


@triton.jit
def _adamw_master_kernel(
    CHUNK_PARAM, CHUNK_START, GRADS, WEIGHTS, OFFSETS, NUMELS, MASTER, EXP_AVG, EXP_AVG_SQ, W0, BETA_POWERS,
    decay, beta1, beta2, lr, eps,
    BLOCK: tl.constexpr, WHOLE_VECTORS: tl.constexpr,
):
    """One chunk of one parameter: decoupled weight decay, both moments, the bias-corrected step, and the bf16
    (weight-dtype) copy of the new master weight. W0 is the first weight, whose pointer type the addresses in
    GRADS and WEIGHTS are cast to; a zero address in GRADS (no gradient this step) leaves the chunk as it is.
    BETA_POWERS holds beta1ᵗ and beta2ᵗ in float64 for this step t, whence the bias corrections.
    WHOLE_VECTORS: every parameter's size is a multiple of ALIGN, so that the bounds mask may be vectorised."""
    step_size = (lr / (1.0 - tl.load(BETA_POWERS))).to(tl.float32)
    bias_correction2_sqrt = tl.sqrt(1.0 - tl.load(BETA_POWERS + 1)).to(tl.float32)
    chunk = tl.program_id(0)
    param = tl.load(CHUNK_PARAM + chunk)
    # Chunks start at multiples of BLOCK and slices at multiples of ALIGN; the caching allocator aligns
    # tensors to 512 bytes. Said to the compiler, this lets it vectorise the loads and stores.
    start = tl.multiple_of(tl.load(CHUNK_START + chunk), BLOCK)
    grad_address = tl.load(GRADS + param)
    numel = tl.where(grad_address != 0, tl.load(NUMELS + param), 0)
    if WHOLE_VECTORS:
        numel = tl.multiple_of(numel, ALIGN)
    base = tl.multiple_of(tl.load(OFFSETS + param), ALIGN)
    grad_ptr = tl.multiple_of(grad_address.to(W0.dtype), 16)
    weight_ptr = tl.multiple_of(tl.load(WEIGHTS + param).to(W0.dtype), 16)
    idx = start + tl.arange(0, BLOCK)
    live = idx < numel
    g = tl.load(grad_ptr + idx, mask=live, other=0.0).to(tl.float32)
    p = tl.load(MASTER + base + idx, mask=live, other=0.0)
    m = tl.load(EXP_AVG + base + idx, mask=live, other=0.0)
    v = tl.load(EXP_AVG_SQ + base + idx, mask=live, other=0.0)
    p = p * decay
    m = m + (1.0 - beta1) * (g - m)
    v = v * beta2 + (1.0 - beta2) * g * g
    p = p - step_size * m / (tl.sqrt(v) / bias_correction2_sqrt + eps)
    tl.store(MASTER + base + idx, p, mask=live)
    tl.store(EXP_AVG + base + idx, m, mask=live)
    tl.store(EXP_AVG_SQ + base + idx, v, mask=live)
    tl.store(weight_ptr + idx, p.to(W0.dtype.element_ty), mask=live)


def _address_list(tensors: list[torch.Tensor | None]) -> list[int]:
    return [0 if t is None else t.data_ptr() for t in tensors]


def _addresses(tensors: list[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """An int64 device tensor of the tensors' data addresses (0 for None), copied from pinned memory without
    blocking the host."""
    host = torch.tensor(_address_list(tensors), dtype=torch.int64, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


def capturing(device: torch.device) -> bool:
    """Whether the current stream of `device` is being captured into a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class MasterWeightAdamW(torch.optim.Optimizer):
    """AdamW (torch.optim.AdamW's update, decoupled weight decay) on fp32 master weights of `params`, which it
    turns into `weight_dtype` tensors in place: the model then computes with those, and each step writes them
    anew from the updated masters. `state[p]` holds views of the master weight and the moments, shaped like p.

    `use_triton`: update with the Triton kernel (None: on CUDA and under the Triton interpreter) or with PyTorch
    ops. A parameter without a gradient in a step keeps its weight and moments (as in torch.optim.AdamW), though
    the bias correction counts the optimizer's steps, not that parameter's.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 weight_dtype: torch.dtype = torch.bfloat16, use_triton: bool | None = None) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        if len(self.param_groups) != 1:
            raise ValueError("MasterWeightAdamW takes one parameter group")
        self.params = self.param_groups[0]["params"]
        device = self.params[0].device
        if any(p.device != device or not p.dtype.is_floating_point for p in self.params):
            raise ValueError("MasterWeightAdamW needs floating-point parameters on one device")
        numels = [p.numel() for p in self.params]
        offsets = [0]
        for n in numels:
            offsets.append(offsets[-1] + triton.cdiv(n, ALIGN.value) * ALIGN.value)
        self.master = torch.zeros(offsets[-1], dtype=torch.float32, device=device)
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.steps = 0
        with torch.no_grad():
            for p, start, n in zip(self.params, offsets, numels, strict=False):
                views = {name: buffer[start:start + n].view_as(p) for name, buffer in
                         (("master", self.master), ("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq))}
                views["master"].copy_(p)
                self.state[p] = views
                p.data = p.data.to(weight_dtype, memory_format=torch.contiguous_format)
        self._triton = device.type == "cuda" or INTERPRET if use_triton is None else use_triton
        if self._triton:
            # Chunk c of parameter i: its program reads i and the chunk's first element, c·BLOCK.
            chunks = [triton.cdiv(n, BLOCK) for n in numels]
            owners = torch.cat([torch.full((c,), i, dtype=torch.int32) for i, c in enumerate(chunks)])
            self._chunk_param = owners.to(device)
            self._chunk_start = torch.cat([torch.arange(c, dtype=torch.int32) * BLOCK for c in chunks]).to(device)
            self._offsets = torch.tensor(offsets[:-1], dtype=torch.int64, device=device)
            self._numels = torch.tensor(numels, dtype=torch.int64, device=device)
            self._weights = _addresses(self.params, device)
            self._whole_vectors = all(n % ALIGN.value == 0 for n in numels)
            # The step count t and (beta1ᵗ, beta2ᵗ), on the device so that a graph's replays advance them.
            self._step = torch.zeros((), dtype=torch.float64, device=device)
            self._betas = torch.tensor(self.defaults["betas"], dtype=torch.float64, device=device)
            self._beta_powers = torch.empty_like(self._betas)
            self._graph_grads = torch.zeros(len(self.params), dtype=torch.int64, device=device)
            self._captured_grads: list[int] | None = None

    @torch.no_grad()
    def step(self, closure=None) -> None:
        """One AdamW update of every parameter that has a gradient."""
        if closure is not None:
            raise ValueError("MasterWeightAdamW.step takes no closure")
        group = self.param_groups[0]
        lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        self.steps += 1
        decay = 1.0 - lr * weight_decay
        if not self._triton:
            step_size = lr / (1.0 - beta1 ** self.steps)
            bias_correction2_sqrt = math.sqrt(1.0 - beta2 ** self.steps)
            for p in self.params:
                if p.grad is not None:
                    _update(p, self.state[p], decay, beta1, beta2, step_size, bias_correction2_sqrt, eps)
            return
        device = self.master.device
        grads = [p.grad for p in self.params]
        if capturing(device):
            self._captured_grads = _address_list(grads)
            table = self._graph_grads
        else:
            table = _addresses(grads, device)
        torch.pow(self._betas, self._step.add_(1), out=self._beta_powers)
        _adamw_master_kernel[(len(self._chunk_param),)](
            self._chunk_param, self._chunk_start, table, self._weights, self._offsets, self._numels,
            self.master, self.exp_avg, self.exp_avg_sq, self.params[0], self._beta_powers,
            decay, beta1, beta2, lr, eps,
            BLOCK=BLOCK, WHOLE_VECTORS=self._whole_vectors, num_warps=NUM_WARPS,
        )

    def write_captured_tables(self) -> None:
        """After a CUDA graph captured `step`: write the addresses of the gradients it saw, which the graph's
        replays read, into the table its kernel reads (nothing when no capture ran a step)."""
        if self._triton and self._captured_grads is not None:
            self._graph_grads.copy_(torch.tensor(self._captured_grads, dtype=torch.int64))
            self._captured_grads = None


def _update(p: torch.Tensor, state: dict[str, torch.Tensor], decay: float, beta1: float, beta2: float,
            step_size: float, bias_correction2_sqrt: float, eps: float) -> None:
    """The kernel's update of one parameter, as PyTorch ops (the path on a CPU without the interpreter)."""
    g = p.grad.float()
    master, exp_avg, exp_avg_sq = state["master"], state["exp_avg"], state["exp_avg_sq"]
    master.mul_(decay)
    exp_avg.lerp_(g, 1.0 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
    master.addcdiv_(exp_avg, exp_avg_sq.sqrt().div_(bias_correction2_sqrt).add_(eps), value=-step_size)
    p.copy_(master)
