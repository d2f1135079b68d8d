"""Mixed-precision experiments: where float16 accumulation loses digits, and which dtypes bf16 autocast produces.

The accumulation experiment adds 0.01 a thousand times (exact answer 10): in fp16 the running sum's spacing grows
past the addend and the sum stalls; accumulating fp16 addends into an fp32 sum keeps the digits, the remaining error
being the fp16 rounding of 0.01 itself.
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import nn

ADDEND = 0.01
REPEATS = 1000
EXACT = ADDEND * REPEATS


def accumulation_experiment() -> pd.DataFrame:
    """Sum 0.01 a thousand times with different accumulator / addend dtypes and casts."""
    cases = [
        ("fp32 += fp32", torch.float32, torch.float32, None),
        ("fp16 += fp16", torch.float16, torch.float16, None),
        ("fp32 += fp16 (implicit promotion)", torch.float32, torch.float16, None),
        ("fp32 += fp16.to(fp32) (explicit cast)", torch.float32, torch.float16, torch.float32),
    ]
    rows = []
    for label, acc_dtype, addend_dtype, cast in cases:
        total = torch.tensor(0.0, dtype=acc_dtype)
        addend = torch.tensor(ADDEND, dtype=addend_dtype)
        for _ in range(REPEATS):
            total += addend.to(cast) if cast is not None else addend
        value = float(total)
        rows.append(
            {
                "case": label,
                "accumulator": str(acc_dtype).removeprefix("torch."),
                "addend": str(addend_dtype).removeprefix("torch."),
                "result": value,
                "abs_error": abs(value - EXACT),
            }
        )
    return pd.DataFrame(rows)


class ToyModel(nn.Module):
    """Linear → ReLU → LayerNorm → Linear: one op of each autocast class (matmul, pointwise, norm)."""

    def __init__(self, in_features: int = 10, out_features: int = 5) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ln(self.relu(self.fc1(x))))


def autocast_dtypes(device: torch.device, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> pd.DataFrame:
    """The dtype of each tensor of a ToyModel step under autocast, observed with forward hooks."""
    torch.manual_seed(seed)
    model = ToyModel().to(device)
    seen: dict[str, torch.dtype] = {}

    def remember(label: str):
        def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            seen[label] = output.dtype

        return hook

    model.fc1.register_forward_hook(remember("fc1 (linear) output"))
    model.ln.register_forward_hook(remember("layer norm output"))
    x = torch.randn(8, 10, device=device)
    y = torch.randint(0, 5, (8,), device=device)
    with torch.autocast(device_type=device.type, dtype=dtype):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    rows = [
        ("parameters (fc1.weight)", model.fc1.weight.dtype),
        ("fc1 (linear) output", seen["fc1 (linear) output"]),
        ("layer norm output", seen["layer norm output"]),
        ("logits (fc2 output)", logits.dtype),
        ("loss", loss.dtype),
        ("gradients (fc1.weight.grad)", model.fc1.weight.grad.dtype),
    ]
    return pd.DataFrame(
        [{"tensor": name, "dtype": str(dt).removeprefix("torch.")} for name, dt in rows]
    ).assign(autocast=str(dtype).removeprefix("torch."), device=device.type)
