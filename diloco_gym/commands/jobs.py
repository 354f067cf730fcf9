"""What the commands that run a protocol share: the command line an output directory records,
and a fleet job's run, write and errors (``run``, ``report`` and ``frontier`` with
``--fleet``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from typing import Any

from diloco_gym.commands import options
from diloco_gym.errors import CLIError, DataError, Interrupted, UsageError

__all__ = ["command_line", "fleet_env_error", "fleet_job", "fleet_report_config"]


def command_line() -> str:
    """The command being run, as a shell line (``diloco-gym ...``), for the output's header."""
    return "diloco-gym " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def fleet_env_error(exc: Exception) -> CLIError:
    """A fleet configuration error as the CLI's error: a bad file is a data error."""
    return DataError(str(exc))


def fleet_job(
    args: argparse.Namespace,
    run: Callable[[], Any],
    write: Callable[[Any, str], Any],
    what: str,
) -> tuple[Any, Any]:
    """Run a fleet job and write its directory (``write(result, command)``): a bad fleet
    file or value is a data error; Ctrl-C leaves ``--out`` as it was."""
    from diloco_gym.sim.fleet import FleetConfigError

    command = command_line()
    try:
        result = run()
        return result, write(result, command)
    except (FleetConfigError, ValueError, KeyError) as exc:
        msg = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        raise DataError(msg) from None
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; no {what} written ({args.out} left as it was)") from None


def fleet_report_config(args: argparse.Namespace, agents: list[str]) -> Any:
    """The fleet protocol's configuration from ``report --fleet`` / ``frontier --fleet``
    options (a bad value is a usage error)."""
    from diloco_gym.eval.fleet import FleetReportConfig

    try:
        return FleetReportConfig(
            fleet=args.fleet, agents=agents, **options.protocol_options(args, settings=False)
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
