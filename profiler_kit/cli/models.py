"""`profiler-kit models` and `profiler-kit precision`: the model presets, and the mixed-precision experiments."""

from __future__ import annotations

import click

from profiler_kit.cli.common import format_option

# The tables `precision` prints (`--table` is checked before any work; its columns once its two small
# experiments have run).
PRECISION_TABLES = ("accumulation", "autocast_dtypes")


def _preset_column(name: str) -> bool:
    from profiler_kit.presets import preset_table

    return name in preset_table().columns


@click.command("models")
@format_option(tables=("model_presets",), columns=_preset_column)
def models_cmd(fmt: str) -> None:
    """The model presets with exact parameter counts."""
    from profiler_kit.presets import preset_table
    from profiler_kit.render import emit_tables

    emit_tables([("model presets", preset_table())], fmt)


@click.command("precision")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@format_option(tables=PRECISION_TABLES)
def precision_cmd(device: str, fmt: str) -> None:
    """Float16 accumulation experiment, and the dtypes seen under bf16 autocast."""
    from profiler_kit import precision
    from profiler_kit.device import resolve_device
    from profiler_kit.render import Title, emit_tables, records

    dev = resolve_device(device)
    sums, dtypes = precision.accumulation_experiment(), precision.autocast_dtypes(dev)
    emit_tables([(Title("sum of 0.01 × 1000 (exact 10)", PRECISION_TABLES[0]), sums),
                 (Title(f"dtypes under bf16 autocast on {dev.type}", PRECISION_TABLES[1]), dtypes)],
                fmt, json_obj={"accumulation": records(sums), "autocast_dtypes": records(dtypes)})


COMMANDS = [models_cmd, precision_cmd]
