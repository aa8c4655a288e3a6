"""The ``opcast`` command: one root app, each stage mounting its own sub-app.

Domain errors (:class:`opcast.errors.OpcastError`) are caught here, at the boundary: one line
on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import inspect
import json
import os
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from opcast.check.validate_cli import calibrate_cmd, validate_cmd
from opcast.cli_common import console, err_console, print_frame
from opcast.collect.cli import app as collect_app
from opcast.errors import OpcastError, Terminated
from opcast.predict.cli import app as predict_app
from opcast.predict.search_cli import app as search_app
from opcast.predict.whatif_cli import compare_app, explore_app
from opcast.train.cli import app as train_app


def _refuse_blank_paths(command: Any) -> None:
    """Make every path argument and option of ``command`` and its subcommands refuse an empty or
    blank value: ``Path("")`` is the current folder, so ``--out ""`` (an unset shell variable)
    wrote a run, a calibration or a model set into whatever folder the command ran in."""
    for param in getattr(command, "params", ()):
        kind = param.type
        if getattr(kind, "name", None) in ("path", "file", "directory") and hasattr(kind, "allow_dash"):
            convert = kind.convert

            def checked(value: Any, param: Any, ctx: Any, _convert: Any = convert, _kind: Any = kind) -> Any:
                if isinstance(value, str) and not value.strip():
                    blank = "a blank" if value else "an empty"
                    _kind.fail(f"{value!r} is {blank} path; give a file or folder name", param, ctx)
                return _convert(value, param, ctx)

            kind.convert = checked
    for sub in (getattr(command, "commands", None) or {}).values():
        _refuse_blank_paths(sub)


class _Interrupted(Exception):
    """A ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM as :class:`~opcast.errors.Terminated`) out of a
    command, carried past typer to :func:`main`: typer >= 0.22 turns one into a silent exit code 130
    when not standalone, so the boundary never saw it."""

    def __init__(self, terminated: bool) -> None:
        super().__init__()
        self.terminated = terminated


class _Root(TyperGroup):
    """The root command: typer builds the whole command tree before it, which it then checks
    (:func:`_refuse_blank_paths`); an interrupt of a command reaches :func:`main` as
    :class:`_Interrupted`."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        _refuse_blank_paths(self)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise _Interrupted(isinstance(exc, Terminated)) from None


app = typer.Typer(
    cls=_Root,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    help="Forecast GPU kernel latency and distributed LLM training/inference time on a CPU.",
)
app.add_typer(collect_app, name="collect")
app.add_typer(predict_app, name="predict")
app.add_typer(search_app, name="search")
app.add_typer(explore_app, name="explore")
app.add_typer(compare_app, name="compare")
app.add_typer(train_app, name="train")
app.command("validate")(validate_cmd)
app.command("calibrate")(calibrate_cmd)

hardware_app = typer.Typer(no_args_is_help=True, help="The hardware catalog (data/hardware/*.json).")
arch_app = typer.Typer(no_args_is_help=True, help="LLM arch presets (data/archs/*.json) and Hugging Face configs.")
app.add_typer(hardware_app, name="hardware")
app.add_typer(arch_app, name="arch")


@hardware_app.command("list")
def hardware_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Every catalog device with its headline numbers."""
    import pandas as pd

    from opcast.hardware import catalog

    rows = [
        {
            "name": s.name,
            "vendor": s.vendor,
            "arch": s.architecture,
            "bf16_tflops": (s.peak_bf16_flops or 0) / 1e12,
            "fp32_tflops": s.peak_fp32_flops / 1e12,
            "mem_gib": s.mem_bytes / 2**30,
            "mem_bw_gbps": s.mem_bw_bytes_per_s / 1e9,
            "sms": s.sm_count,
        }
        for s in catalog().values()
    ]
    frame = pd.DataFrame(rows)
    if as_json:
        console.print_json(frame.to_json(orient="records"))
    else:
        print_frame(frame, title="opcast hardware catalog")


@hardware_app.command("show")
def hardware_show(
    name: Annotated[str, typer.Argument(help="Catalog name or alias, 'local', 'cuda', or a JSON file.")],
) -> None:
    """One device's full spec as JSON ('local' measures this machine's CPU)."""
    from opcast.hardware import device_to_dict, get_device

    # get_device reads cpu, cuda and cuda:N as --gpu does; 'local' is this command's word for cpu ('LOCAL' and
    # ' local' were unknown GPUs, and a name starting with cuda skipped the catalog and the derived names)
    spec = get_device("cpu" if name.strip().lower() == "local" else name)
    console.print_json(json.dumps(device_to_dict(spec)))


@arch_app.command("list")
def arch_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Every arch preset with its size."""
    import pandas as pd

    from opcast.archs import list_archs, load_arch

    rows = []
    for name in list_archs():
        a = load_arch(name)
        rows.append(
            {
                "name": a.name,
                "family": a.family,
                "params_b": a.params_total() / 1e9,
                "layers": a.n_layers,
                "hidden": a.hidden,
                "heads": a.n_heads,
                "kv_heads": a.n_kv_heads,
                "ffn": a.ffn_hidden,
                "vocab": a.vocab,
                "experts": a.n_experts,
            }
        )
    frame = pd.DataFrame(rows)
    if as_json:
        console.print_json(frame.to_json(orient="records"))
    else:
        print_frame(frame, title="opcast arch presets")


@arch_app.command("show")
def arch_show(
    name: Annotated[str, typer.Argument(help="Preset name, preset JSON or Hugging Face config.json.")],
) -> None:
    """One arch as JSON, with its parameter counts."""
    from dataclasses import asdict

    from opcast.archs import load_arch

    a = load_arch(name, given_as="the NAME of opcast arch show")
    console.print_json(
        json.dumps({**asdict(a), "params_total": a.params_total(), "active_params_total": a.active_params_total()})
    )


def _click_exceptions() -> Any:
    """The click exceptions module typer raises from: typer >= 0.22 vendors click as
    ``typer._click`` (no ``click`` installed), older typer depends on ``click`` itself."""
    try:
        return importlib.import_module("typer._click.exceptions")
    except ModuleNotFoundError:
        return importlib.import_module("click.exceptions")


_SPELLED_ELSEWHERE: dict[str, tuple[tuple[str, ...], str]] = {
    "--nodes": (("--gpus",), "this command takes the total GPU count as --gpus (nodes x GPUs per node)"),
    "--gpus": (
        ("--nodes", "--gpus-per-node"),
        "this command takes --nodes and --gpus-per-node (the total GPU count is their product)",
    ),
}
"""An option one command takes and another spells differently: predict train|infer, explore and compare
size a cluster as --nodes x --gpus-per-node, search takes the world size as --gpus. click's guess by
spelling alone pointed ``search train --nodes`` at --models and --workers, ``predict train --gpus`` at
--gpu, --sp and --tp. Used only where the command takes every option the entry names."""


def _usage_message(exc: Any) -> str:
    """click's message of a usage error, or, for an unknown option another command spells differently
    (:data:`_SPELLED_ELSEWHERE`), what this command takes instead of click's guess by spelling."""
    ctx = getattr(exc, "ctx", None)
    unknown = isinstance(exc, _click_exceptions().NoSuchOption)  # not "--nodes option requires an argument"
    instead = _SPELLED_ELSEWHERE.get(exc.option_name) if unknown else None
    if instead is not None and ctx is not None:
        takes = {flag for param in ctx.command.params for flag in (*param.opts, *param.secondary_opts)}
        if set(instead[0]) <= takes:
            return f"{exc.message}; {instead[1]}"
    return str(exc.format_message())


def _usage_line(exc: Any) -> str:
    """One line for a click usage error: what is wrong, then where the help is."""
    message = " ".join(_usage_message(exc).split())
    ctx = getattr(exc, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"opcast: error: {message}{hint}"


def _fail(line: str, code: int) -> int:
    with contextlib.suppress(OSError, ValueError):  # stderr closed as well: the exit code still says it
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)
    return code


def _flush_stdout() -> None:
    """Flush stdout now, so a full or closed stdout (``> /dev/full``, a closed pipe) fails here,
    inside the boundary, not in the interpreter's exit flush (a traceback and exit 120)."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        _silence_stdout()
        raise


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until exit


def _unwrapped_help(app: typer.Typer) -> typer.Typer:
    """``app`` with every command's help taken from its docstring with the line breaks inside a paragraph
    joined: typer's rich help keeps a docstring's single line breaks in its group's command list, so a
    summary wrapped in the source printed as broken lines under ``opcast --help``."""
    for info in app.registered_commands:
        if info.help is None and info.callback is not None and info.callback.__doc__:
            paragraphs = inspect.cleandoc(info.callback.__doc__).split("\n\n")
            info.help = "\n\n".join(" ".join(p.split("\n")) for p in paragraphs)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            _unwrapped_help(group.typer_instance)
    return app


_unwrapped_help(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``opcast`` script; returns the exit code.

    The boundary guarantees one line on stderr and no traceback: 2 for anything the user can fix
    (a domain error, a usage error of the command line, unwritable output), 130 for an
    interrupt, 1 for a bug (with the exception's type and message; ``OPCAST_DEBUG=1`` shows the
    traceback)."""
    click_exc = _click_exceptions()
    no_args_is_help = getattr(click_exc, "NoArgsIsHelpError", ())  # click >= 8.2; older click exits 0 after the help
    try:
        code = app(args=argv, prog_name="opcast", standalone_mode=False)
        _flush_stdout()
    except OpcastError as err:
        return _fail(f"opcast: error: {' '.join(str(err).split())}", 2)
    except typer.Exit as exc:  # raised by commands for a chosen exit code
        return exc.exit_code
    except no_args_is_help as exc:  # a bare group: its help, as click prints it
        exc.show()
        return 2
    except click_exc.ClickException as exc:  # usage errors: unknown command or option, bad value, missing option
        return _fail(_usage_line(exc), exc.exit_code)
    except (typer.Abort, KeyboardInterrupt, _Interrupted) as exc:
        if isinstance(exc, Terminated) or getattr(exc, "terminated", False):
            return _fail("opcast: terminated (SIGTERM); what was written is kept", 143)
        return _fail("opcast: interrupted; what was written is kept", 130)
    except BrokenPipeError:  # the reader went away (| head): not an error of ours
        _silence_stdout()
        return 141
    except OSError as err:
        if err.filename is None and err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EBADF, errno.EIO):
            _silence_stdout()
            return _fail(
                f"opcast: error: cannot write the output ({err.strerror}); free space or redirect stdout elsewhere", 2
            )
        where = f"{err.filename}: " if err.filename else ""
        return _fail(f"opcast: error: {where}{err.strerror or err}; check the path and its permissions", 2)
    except RecursionError:
        return _fail("opcast: error: an input is nested too deeply to read; check the file you passed", 2)
    except MemoryError:
        return _fail("opcast: error: out of memory; try a smaller input or a machine with more memory", 2)
    except Exception as exc:
        if os.environ.get("OPCAST_DEBUG"):
            raise
        first = (str(exc).splitlines() or [""])[0][:300]
        return _fail(
            f"opcast: internal error: {type(exc).__name__}: {first} (a bug in opcast; "
            "rerun with OPCAST_DEBUG=1 for the traceback and report it)",
            1,
        )
    # click returns the code of a typer.Exit raised by a command (e.g. 130 after an interrupted collection)
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


if __name__ == "__main__":
    sys.exit(main())
