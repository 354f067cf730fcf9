"""One message for a missing optional extra: every command that needs ``rl``, ``ray`` or
``live`` reports it the same way, naming the extra and the pip command that installs it."""

from __future__ import annotations

from collections.abc import Sequence

from diloco_gym.errors import UsageError

__all__ = ["missing_extra"]


def missing_extra(
    command: str, extras: Sequence[str], exc: BaseException | None = None
) -> UsageError:
    """The usage error (exit status 2) for ``command`` run without the optional ``extras``:
    ``<command> needs the 'rl' extra: pip install "diloco-gym[rl]" (<why>)``.

    Args:
        command: the ``diloco-gym`` command (or what in it) that needs the extras.
        extras: the extras' names, as in ``pip install "diloco-gym[...]"``.
        exc: the import error that showed the extra missing; its text ends the message.
    """
    names = list(extras)
    if not names or not all(n and n.isidentifier() for n in names):
        raise ValueError(f"missing_extra needs one or more extra names, got {names!r}")
    quoted = " and ".join(f"'{n}'" for n in names)
    noun = "extra" if len(names) == 1 else "extras"
    msg = f'{command} needs the {quoted} {noun}: pip install "diloco-gym[{",".join(names)}]"'
    if exc is not None and str(exc):
        msg += f" ({exc})"
    return UsageError(msg)
