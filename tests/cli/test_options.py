"""Numeric options: SI suffixes for counts and FLOPs, NaN and infinity refused (exit 2) for every one."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from profiler_kit.cli import COMMANDS, main
from profiler_kit.cli.common import Number

BF16 = Path(__file__).resolve().parents[1] / "fixtures" / "kernels" / "h100_tiny_train_bf16.sqlite"


def _numeric_options() -> list[tuple[list[str], str]]:
    """(command path, option flag) for every option of every command that takes a float or a Number."""
    found = []

    def walk(command: click.Command, path: list[str]) -> None:
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, (Number, click.types.FloatParamType)):
                found.append((path, param.opts[0]))
        if isinstance(command, click.Group):
            for name in command.list_commands(None):
                walk(command.get_command(None, name), [*path, name])

    for name in COMMANDS:
        walk(main.get_command(None, name), [name])
    return found


NUMERIC = _numeric_options()


def test_every_float_option_is_a_number():
    assert NUMERIC and all(isinstance(_type(path, flag), Number) for path, flag in NUMERIC)


def _type(path: list[str], flag: str) -> click.ParamType:
    command = main
    for name in path:
        command = command.get_command(None, name)
    return next(p.type for p in command.params if flag in p.opts)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
@pytest.mark.parametrize(("path", "flag"), NUMERIC, ids=[f"{' '.join(p)} {f}" for p, f in NUMERIC])
def test_nan_and_infinity_are_usage_errors(path, flag, value):
    result = CliRunner().invoke(main, [*path, flag, value])  # a short flag takes "=" as part of its value
    assert result.exit_code == 2, result.output
    assert "finite" in result.stderr


def test_si_suffixes():
    number, count = Number(float, min=0, min_open=True), Number(int, min=1)
    assert number.convert("23G", None, None) == 23e9 and number.convert("1.5T", None, None) == 1.5e12
    assert count.convert("1.5k", None, None) == 1500 and count.convert("2M", None, None) == 2_000_000
    for bad in ("1.5", "0", "x", "1Q"):
        with pytest.raises(click.BadParameter):
            count.convert(bad, None, None)


def test_flops_per_step_takes_an_si_suffix():
    result = CliRunner().invoke(main, ["kernels", "summarize", str(BF16), "--flops-per-step", "23G",
                                       "--format", "json"])
    assert result.exit_code == 0, result.output
    plain = CliRunner().invoke(main, ["kernels", "summarize", str(BF16), "--flops-per-step", "23000000000",
                                      "--format", "json"])
    assert json.loads(result.stdout)["mfu"] == json.loads(plain.stdout)["mfu"] is not None
