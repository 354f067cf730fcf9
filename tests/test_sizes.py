"""Module and function sizes: nothing in the package grows past 800 lines per module or 80
lines per function unless CONTRIBUTING.md lists it, with a reason and a size it may not
exceed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80
_ENTRY = re.compile(r"^- `(?P<key>[^`]+)` \((?P<lines>\d+) lines\): \S")


def exceptions(text: str) -> dict[str, int]:
    """The listed exceptions of CONTRIBUTING.md's "Size exceptions": key -> allowed lines."""
    part = text.split("### Size exceptions", 1)
    assert len(part) == 2, "CONTRIBUTING.md has no 'Size exceptions' section"
    found = {}
    for line in part[1].splitlines():
        if line.startswith("#"):
            break
        if m := _ENTRY.match(line):
            found[m["key"]] = int(m["lines"])
    return found


def measured(root: Path) -> dict[str, int]:
    """Every module over the module limit and function over the function limit, by key
    (``path`` or ``path::function``) -> lines."""
    sizes = {}
    files = sorted((root / "diloco_gym").rglob("*.py")) + sorted((root / "agents").glob("*.py"))
    for path in files:
        if (root / "diloco_gym" / "agents") in path.parents:
            continue  # the link to agents/, read once through agents/
        text = path.read_text()
        key = path.relative_to(root).as_posix()
        if text.count("\n") > MAX_MODULE_LINES:
            sizes[key] = text.count("\n")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    sizes[f"{key}::{node.name}"] = max(n, sizes.get(f"{key}::{node.name}", 0))
    return sizes


def problems(sizes: dict[str, int], allowed: dict[str, int]) -> list[str]:
    out = [
        f"{k}: {n} lines, not listed in CONTRIBUTING.md"
        for k, n in sizes.items()
        if k not in allowed
    ]
    out += [
        f"{k}: {n} lines, listed at {allowed[k]}"
        for k, n in sizes.items()
        if k in allowed and n > allowed[k]
    ]
    out += [f"{k}: listed but now within the limit; remove it" for k in allowed if k not in sizes]
    return sorted(out)


def test_sizes_are_within_the_limits_or_listed() -> None:
    allowed = exceptions((ROOT / "CONTRIBUTING.md").read_text())
    bad = problems(measured(ROOT), allowed)
    assert not bad, "size limits:\n" + "\n".join(bad)


def test_the_size_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "diloco_gym").mkdir()
    (tmp_path / "agents").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(90))
    (tmp_path / "diloco_gym" / "big.py").write_text("def f():\n" + body + "\n")
    sizes = measured(tmp_path)
    assert sizes == {"diloco_gym/big.py::f": 91}
    assert problems(sizes, {}) == ["diloco_gym/big.py::f: 91 lines, not listed in CONTRIBUTING.md"]
    assert problems(sizes, {"diloco_gym/big.py::f": 85}) == [
        "diloco_gym/big.py::f: 91 lines, listed at 85"
    ]
    assert problems({}, {"diloco_gym/big.py::f": 91}) == [
        "diloco_gym/big.py::f: listed but now within the limit; remove it"
    ]
    text = (
        "### Size exceptions\n\n- `a.py` (900 lines): a reason.\n## Next\n- `b.py` (1 lines): x.\n"
    )
    assert exceptions(text) == {"a.py": 900}


def test_the_complexity_gate_is_on_and_can_fail(tmp_path):
    """ruff's complexity gate (C901, PLR0915) runs on the package with the project's
    thresholds: a function over them fails the lint, so the long functions stay split."""
    import shutil
    import subprocess
    import sys

    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        import pytest

        pytest.skip("ruff is not installed (the dev extra)")
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(20))
    statements = "\n".join(f"    y{i} = {i}" for i in range(60))
    src = f"def branchy(x):\n{branches}\n    return -1\n\n\n"
    src += f"def long(x):\n{statements}\n    return x\n"
    bad = tmp_path / "diloco_gym" / "bad.py"
    bad.parent.mkdir()
    bad.write_text(src)
    run = subprocess.run(
        [ruff, "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "C901" in run.stdout and "PLR0915" in run.stdout
