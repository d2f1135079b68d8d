"""The Triton kernels' sm_90 machine code, compiled on any machine (no GPU needed): what the "regs" config flag
changes. A wgmma ("HGMMA" in SASS) takes its first operand either from registers (`HGMMA... Rd, Ra, gdesc[..]`)
or, with the second, through a shared-memory descriptor (`HGMMA... Rd, gdesc[..]`); correctness on the GPU is in
test_kernels.py.
"""

from __future__ import annotations

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
