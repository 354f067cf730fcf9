"""Tests mirror the modules: every module of the package has a test file named after it.

A module ``diloco_gym/<layer>/<name>.py`` is tested in ``tests/<layer>/test_<name>*.py`` (a
suffix is allowed: most test folders are not packages, so two test files of one basename in
different folders would collide, e.g. ``tests/envs/test_fleet_env.py`` beside
``tests/sim/test_fleet.py``); a module of a sub-package ``diloco_gym/<layer>/<pkg>/<name>.py``
in ``tests/<layer>/test_<pkg>*.py``; a top-level module ``diloco_gym/<name>.py`` in
``tests/test_<name>*.py``. A module tested elsewhere would be listed with the reason.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "diloco_gym"

#: Modules whose tests live in a file of another name, and why (none today; an entry whose
#: module has its mirror file after all is stale and fails).
ELSEWHERE: dict[str, str] = {}


def _expected(rel: Path) -> list[str]:
    parts = rel.parts
    if len(parts) == 1:
        return [f"tests/test_{rel.stem}*.py"]
    if len(parts) == 2:
        return [f"tests/{parts[0]}/test_{rel.stem}*.py"]
    return [f"tests/{parts[0]}/test_{parts[1]}*.py", f"tests/{parts[0]}/test_{rel.stem}*.py"]


def _modules() -> list[Path]:
    # diloco_gym/agents is a link to the repository's agents/ folder: rglob does not follow
    # it, so its modules are listed through the link explicitly.
    found = [p for p in PACKAGE.rglob("*.py") if "agents" not in p.relative_to(PACKAGE).parts]
    found += (PACKAGE / "agents").glob("*.py")
    return sorted(p.relative_to(PACKAGE) for p in found if p.name != "__init__.py")


def test_every_module_has_its_test_file():
    missing = []
    for rel in _modules():
        key = rel.as_posix()
        mirrored = any(list(ROOT.glob(pattern)) for pattern in _expected(rel))
        if key in ELSEWHERE:
            assert not mirrored, f"{key} has its mirror file: drop it from ELSEWHERE"
            assert (ROOT / ELSEWHERE[key]).is_file(), f"{key}: {ELSEWHERE[key]} is gone"
        elif not mirrored:
            missing.append(f"diloco_gym/{key} (expected {' or '.join(_expected(rel))})")
    assert not missing, "modules without a mirror test file:\n" + "\n".join(missing)


def test_the_check_sees_every_layer():
    layers = {rel.parts[0] for rel in _modules() if len(rel.parts) > 1}
    assert {"sim", "envs", "agents", "eval", "rl", "live", "lm", "scale", "commands"} <= layers
    assert _expected(Path("sim/loaders/azure.py"))[0] == "tests/sim/test_loaders*.py"
