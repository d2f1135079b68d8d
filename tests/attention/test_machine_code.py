"""The Triton kernels' sm_90 machine code, compiled on any machine (no GPU needed): what the "regs" config flag
changes. A wgmma ("HGMMA" in SASS) takes its first operand either from registers (`HGMMA... Rd, Ra, gdesc[..]`)
or, with the second, through a shared-memory descriptor (`HGMMA... Rd, gdesc[..]`); correctness on the GPU is in
test_kernels.py.
"""

from __future__ import annotations

import re

import pytest


def _operand_sources(compiled_facts, kernel: str, shape: tuple) -> dict:
    """How many of a config's wgmma instructions take their first operand from registers, of how many. (Spills
    depend on the Triton version: the GPU machine's 3.6 compiles these without, see tools/flash_sass.py.)"""
    return compiled_facts(
        "import json, re\n"
        "from profiler_kit.attention.machine_code import compile_sm90, machine_code\n"
        f"_, sass = machine_code(compile_sm90({kernel!r}, 64, True, {shape!r}, tma=True))\n"
        "wgmma = re.findall(r'HGMMA\\.\\S+ R\\d+, (\\S+)', sass)\n"
        "print(json.dumps({'wgmma': len(wgmma), 'from_registers': sum(a.startswith('R') for a in wgmma)}))\n"
    )


@pytest.mark.parametrize(("kernel", "shape"), [
    ("dkdv", (64, 64, 4, 4, "overlap")),  # K·Qᵀ and V·dOᵀ read K and V
    ("dq", (64, 64, 4, 3)),  # Q·Kᵀ and dO·Vᵀ read Q and dO
    ("fwd", (128, 64, 8, 3)),  # Q·Kᵀ reads Q
])
def test_regs_flag_feeds_every_matmul_from_registers(compiled_facts, kernel, shape):
    without = _operand_sources(compiled_facts, kernel, shape)
    with_regs = _operand_sources(compiled_facts, kernel, (*shape, "regs"))
    # Without the flag the resident tiles' matmuls read shared memory; P and dS come from registers either way.
    assert 0 < without["from_registers"] < without["wgmma"]
    assert with_regs["from_registers"] == with_regs["wgmma"] > 0


@pytest.mark.parametrize(("dtype", "head_dim"), [("bf16", 64), ("fp32", 16)])
def test_kernels_compile_as_inductor_launches_them_without_fp64_arithmetic(compiled_facts, dtype, head_dim):
    """Under torch.compile each kernel runs the first config `Kernel.launch_traced` offers (autotuning off) from
    Inductor's code, which loads through pointers and passes the float scalars (the softmax scales) as fp64: the
    kernels compile so, and convert those scalars to fp32 where they enter, doing no fp64 arithmetic."""
    facts = compiled_facts(
        "import json, re, torch\n"
        "from profiler_kit.attention.machine_code import compile_sm90\n"
        "from profiler_kit.attention.triton_kernels.bwd import KERNELS\n"
        f"q = torch.empty(0, dtype={'torch.bfloat16' if dtype == 'bf16' else 'torch.float32'})\n"
        "facts = {}\n"
        "for name, kernel in KERNELS.items():\n"
        f"    first = kernel.pruner(kernel.configs, {{'Q': q}}, HEAD_DIM={head_dim}, CAUSAL=True, TMA=False)[0]\n"
        "    shape = kernel.shapes[kernel.configs.index(first)]\n"
        f"    ttir = compile_sm90(name, {head_dim}, True, shape, dtype={dtype!r}, traced=True).asm['ttir']\n"
        "    body = [line.strip() for line in ttir.splitlines() if 'f64' in line and 'tt.func' not in line]\n"
        "    facts[name] = {'params': re.findall(r'%(\\w+): f64', ttir), 'f64_ops': body}\n"
        "print(json.dumps(facts))\n"
    )
    assert set(facts) == {"fwd", "dkdv", "dq"}
    for name, kernel in facts.items():
        assert kernel["params"] == (["qk_scale"] if name == "fwd" else ["qk_scale", "sm_scale"]), kernel
        converted = [re.match(r"%\S+ = arith\.truncf %(\w+) : f64 to f32", op) for op in kernel["f64_ops"]]
        assert all(converted), kernel["f64_ops"]
        assert sorted(m.group(1) for m in converted) == sorted(kernel["params"])
