"""`mypy diloco_gym` must pass where none of the optional extras is installed.

mypy reports an import it cannot resolve as an error, so every third-party package the
package imports outside its core dependencies (the extras rl, live, ray, parquet, torchrl)
has to be listed in the ``ignore_missing_imports`` override of ``pyproject.toml``. This test
reads every import of ``diloco_gym/`` (function-local ones included) and fails naming each
one that is neither standard library, the project, a core dependency nor listed there.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "diloco_gym"

# The import name of each core dependency of pyproject.toml (a distribution name and its
# import name differ for some).
IMPORT_NAMES = {"pyyaml": "yaml", "scikit-learn": "sklearn"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _core_imports() -> set[str]:
    names = set()
    for requirement in _pyproject()["project"]["dependencies"]:
        dist = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()
        names.add(IMPORT_NAMES.get(dist, dist.replace("-", "_")))
    return names


def _ignored_patterns() -> list[str]:
    patterns: list[str] = []
    for override in _pyproject()["tool"]["mypy"].get("overrides", []):
        if override.get("ignore_missing_imports"):
            modules = override["module"]
            patterns += [modules] if isinstance(modules, str) else modules
    return patterns


def _listed(module: str, patterns: list[str]) -> bool:
    # mypy's "pkg.*" matches pkg and every submodule; a bare name matches itself only.
    for pattern in patterns:
        if pattern.endswith(".*"):
            base = pattern[:-2]
            if module == base or module.startswith(base + "."):
                return True
        elif module == pattern:
            return True
    return False


def _third_party_imports() -> dict[str, list[str]]:
    """Top-level imported module -> the places importing it, for every absolute import."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in ("diloco_gym", "agents"):
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.setdefault(module, []).append(where)
    return found


def test_every_optional_import_is_listed_for_mypy():
    core = _core_imports()
    patterns = _ignored_patterns()
    unlisted = {
        module: places
        for module, places in _third_party_imports().items()
        if module.split(".")[0] not in core and not _listed(module, patterns)
    }
    assert not unlisted, (
        "imports of packages outside the core dependencies that mypy would report as "
        "missing where the extras are absent; list them in pyproject.toml's "
        f"ignore_missing_imports override: {unlisted}"
    )


def test_the_check_sees_the_optional_imports():
    # The scan finds the rl and live extras' imports (so the test above can fail), and the
    # matcher follows mypy's rule for "pkg.*".
    imports = _third_party_imports()
    assert any(m.split(".")[0] == "stable_baselines3" for m in imports)
    assert any(m.split(".")[0] == "torch" for m in imports)
    assert _listed("torch.nn", ["torch.*"]) and _listed("torch", ["torch.*"])
    assert not _listed("torchvision", ["torch.*"]) and not _listed("torch.nn", ["torch"])
