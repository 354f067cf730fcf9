"""Numbers as text for the tables and console lines of reports and calibration summaries (a
leaf: it imports nothing of the project)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["count", "finite", "finite_float", "fmt", "fmt_p"]


def finite(x: Any) -> bool:
    """Whether ``x`` is a finite number (``None``, NaN, infinities and text are not)."""
    try:
        return x is not None and math.isfinite(x)
    except (TypeError, ValueError, OverflowError):
        return False


def finite_float(x: Any) -> float | None:
    """``x`` as a finite float, or ``None`` (missing, not a number, NaN or infinite)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def fmt(x: Any, nd: int = 2, missing: str = "n/a") -> str:
    """``x`` with ``nd`` decimals, or ``missing`` when it is not a finite number."""
    return f"{x:.{nd}f}" if finite(x) else missing


def fmt_p(p: float) -> str:
    """A p-value: three decimals, ``<0.001`` below that, ``n/a`` when not finite."""
    if not finite(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def count(n: int, noun: str) -> str:
    """``1 cell``, ``2 cells``: a count with its noun, plural when not one."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def md_text(x: Any) -> str:
    """``x`` as text for a Markdown line or table cell: a control character (a newline in
    a name would start a line of its own) shown escaped (``\\n``) and ``|`` escaped (it
    would split a table cell)."""
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(x))
    return text.replace("|", "\\|")
