"""Option parsing shared by the commands: comma lists, numbers (SI suffixes, never NaN or infinity), the output
format."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from profiler_kit.defaults import DEFAULT_MODULES
from profiler_kit.errors import ProfilerKitError
from profiler_kit.names import module_depth
from profiler_kit.render import FORMATS, OutputFormat


class ProgramGroup(click.Group):
    """A group whose first unknown word is a program named without `--` (as after `nsys profile`): a usage
    error that says where the program goes, instead of "No such command"."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            subcommands = ", ".join(self.list_commands(ctx))
            raise click.UsageError(f"{name!r} is not a subcommand ({subcommands}): put the program after `--`, "
                                   f"as in `{ctx.command_path} -- {shlex.join(args)}`", ctx)
        return super().resolve_command(ctx, args)


# Where the command to profile starts on the command line; click would read its words as a subcommand.
COMMAND_KEY = "profiler_kit.command"


class CommandGroup(ProgramGroup):
    """A group that also takes `-- COMMAND [ARGS]...`: everything after `--` is the program to profile."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            if at == len(args) - 1 and not ctx.resilient_parsing:
                raise click.UsageError(f"nothing after `--`: give the program to run, as in "
                                       f"`{ctx.command_path} -- python train.py`", ctx)
            ctx.meta[COMMAND_KEY] = args[at + 1:]
            args = args[:at]
        return super().parse_args(ctx, args)


def comma_list(kind: Callable[[str], Any] = str, positive: bool = False) -> Callable:
    """A click callback that parses `a,b,c` into a list, checking each item."""

    def parse(ctx: click.Context, param: click.Parameter, value: Any) -> list | None:
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        items = [s.strip() for s in str(value).split(",") if s.strip()]
        if not items:
            raise click.BadParameter("needs at least one value")
        out = []
        for item in items:
            try:
                parsed = kind(item)
            except (ValueError, KeyError) as exc:
                raise click.BadParameter(f"{item!r}: {exc}") from None
            if positive and parsed <= 0:
                raise click.BadParameter(f"{item!r} must be positive")
            out.append(parsed)
        return out

    return parse


def single(kind: Callable[[str], Any] = str, positive: bool = False) -> Callable:
    """A click callback like `comma_list` that accepts exactly one value (commands that run one config)."""
    parse_list = comma_list(kind, positive)

    def parse(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        values = parse_list(ctx, param, value)
        if len(values) != 1:
            raise click.BadParameter("takes one value here (benchmark sweeps lists)")
        return values[0]

    return parse


def one_of(names: Sequence[str] | Callable[[], Sequence[str]]) -> Callable[[str], str]:
    """An item parser for `comma_list`/`single` that accepts only `names` (or what a callable returns, looked up
    when parsing: lets a command name choices from a module it only imports when it runs)."""

    def check(name: str) -> str:
        allowed = names() if callable(names) else names
        if name not in allowed:
            raise ValueError(f"choose from {', '.join(allowed)}")
        return name

    return check


def _check_table_option(fmt: OutputFormat) -> None:
    """`--table` picks the one table CSV prints; the other formats print every table."""
    if fmt.table is not None and fmt != "csv":
        raise click.UsageError(f"--table {fmt.table}: picks the table of --format csv (the {fmt} format prints "
                               "every table; --csv-dir DIR writes each to its own file with any format)")


def _check_table_name(wanted: str, tables: Sequence[str]) -> None:
    """A usage error, before any work, when `--table` names none of the tables the command can print (a name, the
    start of one, or a number); whether this run's report has that table is known once it is made."""
    if (wanted.isdigit() and 1 <= int(wanted) <= len(tables)) or any(t.startswith(wanted) for t in tables):
        return
    raise click.UsageError(f"--table {wanted!r}: choose one of {', '.join(tables)} (or 1-{len(tables)})")


def _check_column_names(columns: Sequence[str], known: Callable[[str], bool]) -> None:
    """A usage error, before any work, for `--columns` names that no table of the command can have."""
    unknown = [c for c in columns if not known(c)]
    if unknown:
        raise click.UsageError(f"--columns: no table of this command has {', '.join(unknown)} (--wide shows every "
                               "column of a report)")


def format_option(default: str = "table", tables: Sequence[str] = (),
                  columns: Callable[[str], bool] | None = None) -> Callable:
    """`--format` and the options that shape it (`--columns`, `--wide`, `--table`, `--csv-dir`); the command
    gets `fmt`, an OutputFormat for render.emit_tables. `tables` are the names of the tables the command can
    print and `columns` says whether a name may be a column of one (`names.report_column`): `--table` and
    `--columns` are checked against them before any work."""

    def check(ctx: click.Context) -> None:
        fmt = ctx.meta.get(("format", id(ctx)))
        if fmt is None:
            return
        _check_table_option(fmt)
        if fmt.table is not None and tables:
            _check_table_name(fmt.table, tables)
        if fmt.columns and columns is not None:
            _check_column_names(fmt.columns, columns)

    def remember(key: str) -> Callable:
        """A callback that puts an option shaping the output on the command's OutputFormat (made by `--format`,
        before or after this option)."""

        def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
            ctx.meta.setdefault(("output", id(ctx)), {})[key] = value
            if ("format", id(ctx)) in ctx.meta:
                setattr(ctx.meta[("format", id(ctx))], key, value)
                check(ctx)

        return callback

    def output_format(ctx: click.Context, _param: click.Parameter, value: str) -> OutputFormat:
        fmt = OutputFormat(value, **ctx.meta.get(("output", id(ctx)), {}))
        ctx.meta[("format", id(ctx))] = fmt
        check(ctx)
        return fmt

    table_help = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "") if tables else "categories, ..."
    options = [
        click.option("--format", "fmt", type=click.Choice(FORMATS), default=default, show_default=True,
                     callback=output_format,
                     help="table for people (as wide as the terminal, else $COLUMNS, else 120 columns); "
                          "json/csv/markdown (md) print only that on stdout; csv prints one table (--table).",),
        click.option("--columns", metavar="A,B,...", default=None, expose_value=False,
                     callback=lambda ctx, param, value: remember("columns")(
                         ctx, param, tuple(comma_list()(ctx, param, value) or ())),
                     help="The columns a table or Markdown shows (default: the main ones, fitted to the width)."),
        click.option("--wide", is_flag=True, expose_value=False, callback=remember("wide"),
                     help="Show every column, however wide."),
        click.option("--table", metavar="NAME", default=None, expose_value=False, callback=remember("table"),
                     help=f"With --format csv: the table to print, by name ({table_help}) or number "
                          "[default: the first]."),
        click.option("--csv-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                     expose_value=False, callback=remember("csv_dir"),
                     help="Also write every table, every column, to DIR/<name>.csv (with any --format)."),
    ]

    def decorate(fn: Callable) -> Callable:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


class Number(click.ParamType):
    """A count or amount: finite (NaN and infinity refused), SI suffixes k, M, G, T, P accepted (`23G`, `1.5T`),
    at least `min` (above it when `min_open`); an int when `kind` is int (then `1.5k` is 1500, `1.5` refused)."""

    SUFFIXES = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}

    def __init__(self, kind: type = float, min: float | None = None, min_open: bool = False) -> None:
        self.kind, self.min, self.min_open = kind, min, min_open
        self.name = "integer" if kind is int else "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            text = str(value).strip().replace("_", "")
            scale = self.SUFFIXES.get(text[-1:], 1.0)
            try:
                number = float(text[:-1] if scale != 1.0 else text) * scale
            except ValueError:
                self.fail(f"{value!r} is not a number (SI suffixes k, M, G, T, P are accepted)", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.kind is int:
            if number != int(number):
                self.fail(f"{value!r} is not a whole number", param, ctx)
            number = int(number)
        if self.min is not None and (number < self.min or (self.min_open and number == self.min)):
            positive = (self.min == 0 and self.min_open) or (self.kind is int and self.min == 1)
            bound = "positive" if positive else f"{'above' if self.min_open else 'at least'} {self.min:g}"
            self.fail(f"{value!r} must be {bound}", param, ctx)
        return number


FORCE = click.option("-f", "--force", is_flag=True,
                     help="Replace output files that exist (never an input of this command).")



def _module_setting(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    try:
        module_depth(value)
    except ProfilerKitError:
        raise click.BadParameter(f"{value!r}: expected depth:N (N at least 1), all or none") from None
    return value


MODULES_HELP = ("a range for every module call down to depth N (`blocks` is 1, `blocks.3.attn` 3), at every "
                "depth (all), or none; with each module's backward, recomputation and FLOPs.")


def modules_option(help_text: str) -> Callable:
    """`--modules depth:N|all|none`, checked before anything runs."""
    return click.option("--modules", default=DEFAULT_MODULES, show_default=True, metavar="depth:N|all|none",
                        callback=_module_setting, help=help_text)

positive_int = Number(int, min=1)
non_negative_int = Number(int, min=0)
positive_float = Number(float, min=0, min_open=True)
non_negative_float = Number(float, min=0)


def model_name(name: str) -> str:
    """Canonical preset name, or ValueError (→ a usage error through `comma_list`)."""
    from profiler_kit.errors import ProfilerKitError
    from profiler_kit.presets import from_name

    try:
        return from_name(name).name
    except ProfilerKitError as exc:
        raise ValueError(str(exc)) from None


def workload_options(sweep: bool) -> Callable:
    """The options that describe the workload, shared by `benchmark` (comma lists, swept as a product when
    `sweep`) and the one-config commands `nsys` and `memory`. Values land in the command as `model`, `ctx`,
    `mode`, `attention`, `optimizer` (lists when `sweep`), `batch_size`, `mixed_precision`, `compile_`,
    `cuda_graphs`, `device`, `seed`, `nvtx`, `memory_limit_gib`."""
    from profiler_kit.names import ATTENTION_IMPLS, MODES, OPTIMIZERS

    pick = comma_list if sweep else single
    many = " (comma list: swept as a product)" if sweep else ""

    def listed(flag: str, default: str, callback: Callable, text: str) -> Callable:
        """An option that takes a comma list when `sweep`, else one value."""
        return click.option(flag, default=default, show_default=True, callback=callback, help=f"{text}{many}.")

    options = [
        listed("--model", "small", pick(model_name), "Model preset (profiler-kit models)"),
        listed("--ctx", "256", pick(positive_int), "Context length in tokens"),
        listed("--mode", "train", pick(one_of(MODES)), "forward | forward-backward | train (forward+backward+AdamW)"),
        click.option("--batch-size", type=positive_int, default=4, show_default=True),
        click.option("--mixed-precision", is_flag=True, help="bf16 autocast."),
        click.option("--compile", "compile_", is_flag=True, help="torch.compile the model."),
        click.option("--cuda-graphs", is_flag=True,
                     help="With --compile: replay the compiled forward and backward as CUDA graphs "
                          "(torch.compile mode reduce-overhead)."),
        listed("--attention", "naive", pick(one_of(ATTENTION_IMPLS)), " | ".join(ATTENTION_IMPLS)),
        click.option(
            "--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True
        ),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--memory-limit-gib", type=positive_float, default=None,
                     help="Let the CUDA caching allocator hold at most this many GiB, as on a smaller GPU."),
        click.option(
            "--nvtx/--no-nvtx", default=True, show_default=True, help="NVTX ranges around phases/layers."
        ),
        listed(
            "--optimizer",
            OPTIMIZERS[0],
            pick(one_of(OPTIMIZERS)),
            "AdamW as one fused kernel chain, multi-tensor (foreach) kernels, or a per-parameter loop (with "
            "--compile the foreach and loop steps are compiled too); adamw-master: bf16 weights in the model, "
            "fp32 master weights and moments in the optimizer, one Triton kernel per update (needs "
            "--mixed-precision)",
        ),
    ]

    def decorate(fn: Callable) -> Callable:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate
