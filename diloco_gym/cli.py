"""The ``diloco-gym`` command line: the parser, the table of commands (each in a module of
:mod:`diloco_gym.commands`) and :func:`main`, which runs one and handles its errors.

Failure handling: every command reports a user error as one line on stderr,
``diloco-gym: <what is wrong>``, and exits with status 2 for a usage error (a bad option
value, an unknown name, an output directory it refuses to replace), 1 for a data error (a
missing, unreadable or malformed trace, calibration or model file, a trace too short for
an episode) and 130 when interrupted by Ctrl-C; never a Python traceback. Unexpected
internal errors also print one line, naming the exception; set ``DILOCO_GYM_TRACEBACK=1``
to see the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any, NoReturn

from diloco_gym.commands import (
    bench,
    calibrate,
    calibrate_learners,
    frontier,
    report,
    run,
    sweep,
    train,
    tune,
    validate,
)
from diloco_gym.commands.extras import missing_extra
from diloco_gym.errors import CLIError, DataError, Interrupted, UsageError

__all__ = ["main", "CLIError", "UsageError", "DataError", "Interrupted", "CLIExit", "exit_status"]


#: The commands, each a module of :mod:`diloco_gym.commands`, in ``--help``'s order: each
#: module has ``HELP`` (its line in ``diloco-gym --help``), ``add_arguments(parser)`` and
#: ``run(args) -> int``; one with ``SLOW_OPTIONS = True`` gets its options only when it is
#: the command being run (see :func:`build_parser`).
COMMANDS = (
    ("run", run),
    ("report", report),
    ("frontier", frontier),
    ("bench", bench),
    ("sweep", sweep),
    ("tune", tune),
    ("train", train),
    ("calibrate", calibrate),
    ("calibrate-learners", calibrate_learners),
    ("validate", validate),
)


class CLIExit(SystemExit):
    """Raised by :func:`main` after it printed an error line: ``code`` is the exit status
    and ``str()`` the message (so ``pytest.raises(SystemExit, match=...)`` sees it)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


#: The message for a ``MemoryError``: made when this module is imported, since nothing may
#: be allocated or imported while the machine is out of memory.
_OUT_OF_MEMORY = (
    "out of memory; an input implies more than this machine holds (see docs/limits.md for "
    "the size limits and the variables that set them)"
)


def _loaded_class(module: str, name: str) -> type | tuple[()]:
    """Class ``name`` of ``module`` if that module is imported, else ``()`` (which nothing
    is an instance of): an exception of a module never imported cannot have been raised,
    so the error handler imports nothing (an import could fail out of memory, or pull in
    the live stack's torch)."""
    loaded = sys.modules.get(module)
    found = getattr(loaded, name, None) if loaded is not None else None
    return found if isinstance(found, type) else ()


def exit_status(exc: BaseException) -> tuple[int, str]:
    """The exit status and the one-line message for an exception a command raised.

    The order matters: ``TraceFormatError`` is a ``ValueError`` (data, 1) and a bare
    ``ValueError`` is a parameter that failed validation (usage, 2). A ``MemoryError`` is
    answered first, with a message made in advance; no module is imported here.
    """
    if isinstance(exc, MemoryError):
        return 1, _OUT_OF_MEMORY
    if isinstance(exc, KeyboardInterrupt):
        return 130, "interrupted"
    if isinstance(exc, CLIError):
        return exc.exit_code, str(exc)
    data_errors = (
        _loaded_class("diloco_gym.sim.traces", "TraceFormatError"),
        _loaded_class("diloco_gym.live.errors", "CalibrationError"),
        _loaded_class("diloco_gym.sim.learner_calibration", "LearnerCalibrationError"),
    )
    if any(isinstance(exc, kind) for kind in data_errors):
        return 1, str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name == "pyarrow":  # the parquet extra
        return 1, str(exc)
    if isinstance(exc, OSError):
        if exc.strerror and exc.filename:
            return 1, f"{exc.filename}: {exc.strerror}"
        return 1, str(exc)
    if isinstance(exc, KeyError):
        return 1, str(exc.args[0]) if exc.args else repr(exc)
    if isinstance(exc, ValueError):
        return 2, str(exc)
    return 1, (
        f"internal error: {type(exc).__name__}: {exc} "
        f"(set DILOCO_GYM_TRACEBACK=1 to see the traceback)"
    )


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Show a trace loader's warning (rows deliberately left out) and a sweep store's (a
    line of ``cells.jsonl`` set aside) as one line, ``diloco-gym: warning: ...``; other
    warnings keep Python's format."""
    from diloco_gym.scale.sweep import SweepStoreWarning
    from diloco_gym.sim.loaders import TraceFilterWarning

    trusted = sys.modules.get("diloco_gym.agents.learned")
    one_line: tuple[type[Warning], ...] = (TraceFilterWarning, SweepStoreWarning)
    if trusted is not None:
        one_line += (trusted.TrustedModelFileWarning, trusted.LearnerMismatchWarning)
    if issubclass(category, one_line):
        print(f"diloco-gym: warning: {_one_line(str(message))}", file=file or sys.stderr)
        return
    _PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)


_PYTHON_SHOWWARNING = warnings.showwarning


def _one_line(msg: str) -> str:
    return " ".join(part.strip() for part in str(msg).splitlines() if part.strip())


def _close_progress_bars() -> None:
    """Close open tqdm bars now, so that their last redraw (at garbage collection) does not
    land after the one-line message (tqdm is not imported if no command did)."""
    loaded = sys.modules.get("tqdm")
    tqdm = getattr(loaded, "tqdm", None)
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


def _version() -> str:
    import diloco_gym

    return diloco_gym.__version__


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (argparse prints the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """The one place a default is printed, for every command: appends ``(default: X)`` only
    where it informs: not when the help already states the default (so no option shows it
    twice), not for a required option, a ``None`` or suppressed default or an on/off flag."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "default" in text
            or action.required
            or action.default is None
            or action.default is argparse.SUPPRESS
            or isinstance(action.default, bool)
        ):
            return text
        return super()._get_help_string(action)


def _add_commands(sub: Any, fmt: type[argparse.HelpFormatter], command: str | None) -> None:
    """Register each (name, module) of :data:`COMMANDS` as a sub-command; a module with
    ``SLOW_OPTIONS`` gets its options only when ``command`` is its name or ``None``."""
    for name, module in COMMANDS:
        p = sub.add_parser(name, help=module.HELP, formatter_class=fmt)
        if command in (None, name) or not getattr(module, "SLOW_OPTIONS", False):
            module.add_arguments(p)
        p.set_defaults(func=module.run)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``diloco-gym`` parser. ``train`` and ``calibrate`` take their options from modules
    that import stable-baselines3 and torch (seconds): given the ``command`` being run, the
    other commands' parsers leave them out, so ``report`` and ``--help`` start fast."""
    parser = _Parser(
        prog="diloco-gym",
        description="Schedule DiLoCo outer merges on hosts shared with LLM serving, and judge "
        "schedulers against a matched-random baseline.",
        epilog="Exit status: 0 success, 1 a data error (missing or malformed trace, "
        "calibration or model file), 2 a usage error, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_commands(sub, _HelpFormatter, command)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ``diloco-gym`` command.

    Returns:
        The command's exit status (0 on success).

    Raises:
        SystemExit: on any error, after printing one line on stderr (a :class:`CLIExit`
            whose ``code`` is 2 for usage errors, 1 for data errors, 130 for Ctrl-C), or
            argparse's own exit for ``--help``, ``--version`` and unparsable options.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["train"] and "-h" not in argv and "--help" not in argv:
            try:
                import diloco_gym.rl.train  # noqa: F401
            except ImportError as exc:  # the rl extra is missing: say so before argparse
                raise missing_extra("train", ["rl"], exc) from None
        parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else "")
        args = parser.parse_args(argv)
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning  # restored when the command ends
            if not getattr(args, "trust_model_file", False):
                return int(args.func(args) or 0)
            from diloco_gym.agents.learned import trusting_model_files

            # this process only; diloco_gym.backends tells its workers by an argument
            with trusting_model_files():
                return int(args.func(args) or 0)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: B036 - Ctrl-C included: one line, no traceback
        if os.environ.get("DILOCO_GYM_TRACEBACK") and not isinstance(exc, KeyboardInterrupt):
            raise
        if isinstance(exc, MemoryError):
            # let the frames that filled memory go before anything else is done
            exc.__traceback__ = None
            exc.__context__ = None
        code, msg = exit_status(exc)
        msg = _one_line(msg)
        _close_progress_bars()
        print(f"diloco-gym: {msg}", file=sys.stderr)
        raise CLIExit(code, f"diloco-gym: {msg}") from None
    finally:
        if "diloco_gym.eval.outlock" in sys.modules:  # a refused or failed run unlocks too
            sys.modules["diloco_gym.eval.outlock"].release_out_locks()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
