"""A test skipped for a missing package names the extra that installs it: every
``pytest.importorskip(module, reason="... the X extra ...")`` in the tests names an extra of
pyproject.toml whose requirements provide ``module`` (``ray.rllib`` needs ``ray[rllib]``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _extras() -> dict[str, list[str]]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _provides(requirement: str, module: str) -> bool:
    """Whether ``requirement`` (a PEP 508 string) installs ``module``: the distribution is
    named as the module's top-level package and, for ``pkg.sub``, carries the extra ``sub``
    (Ray's layout: ``ray.rllib`` comes with ``ray[rllib]``, ``ray.tune`` with ``ray[tune]``)."""
    m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", requirement)
    assert m, requirement
    name = m.group(1).lower().replace("-", "_")
    extras = {e.strip() for e in (m.group(2) or "").split(",") if e.strip()}
    top, _, sub = module.partition(".")
    if name != top:
        return False
    return not sub or sub.split(".")[0] in extras


def _named_skips() -> list[tuple[str, int, str, str]]:
    """(file, line, module, extra) of every importorskip whose reason names an extra."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip"
            ):
                continue
            reason = next((k.value for k in node.keywords if k.arg == "reason"), None)
            if not (isinstance(reason, ast.Constant) and isinstance(node.args[0], ast.Constant)):
                continue
            m = re.search(r"the (?:diloco-gym\[)?([a-z0-9-]+)\]? extra", reason.value)
            if m:
                rel = str(path.relative_to(ROOT))
                found.append((rel, node.lineno, node.args[0].value, m.group(1)))
    return found


def test_skip_reasons_name_the_extra_that_installs_the_missing_module():
    skips = _named_skips()
    assert any(module == "ray.rllib" for _, _, module, _ in skips)  # the scan sees them
    extras = _extras()
    wrong = [
        f"{file}:{line}: {module} is not in the {extra!r} extra"
        for file, line, module, extra in skips
        if not any(_provides(r, module) for r in extras.get(extra, []))
    ]
    assert not wrong, "\n".join(wrong)
