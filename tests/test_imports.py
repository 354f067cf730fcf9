"""What importing the package (and using the env) loads, the Parquet extra, and that a report
leaves the caller's matplotlib alone.

Import times themselves are not asserted (the machines that run this are shared and noisy);
benchmarks/README.md records them. What is asserted is which heavy modules get loaded: that
is what makes ``import diloco_gym`` (paid by every spawned worker) slow or fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from diloco_gym.cli import exit_status
from diloco_gym.sim.loaders import load_native, load_trace, save_native
from diloco_gym.sim.traces import Trace

ROOT = Path(__file__).resolve().parents[1]

#: Modules that neither importing the package nor building and stepping an env may load.
NOT_FOR_THE_ENV = ("pyarrow", "matplotlib", "matplotlib.pyplot", "pandas", "tqdm")


def _loaded_after(code: str, watch: tuple[str, ...]) -> list[str]:
    """The modules of ``watch`` present in ``sys.modules`` after running ``code`` in a fresh
    interpreter that imports this checkout's package."""
    probe = (
        f"import json, sys\n{code}\n"
        f"print(json.dumps([m for m in {list(watch)!r} if m in sys.modules]))"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_loads_no_scipy_pyarrow_matplotlib_or_pandas():
    """``import diloco_gym`` needs only numpy and gymnasium: scipy (its signal package alone
    is most of the old import time), numba (the compiled kernel loads it with the first
    episode), pyarrow, matplotlib, pandas and tqdm stay unloaded, and
    so does importlib.metadata until ``__version__`` is asked for."""
    watch = (
        "scipy",
        "scipy.signal",
        "scipy.special",
        "scipy.stats",
        "importlib.metadata",
        "numba",
    ) + NOT_FOR_THE_ENV
    assert _loaded_after("import diloco_gym", watch) == []
    code = "import diloco_gym\nassert diloco_gym.__version__ == diloco_gym.__version__ != ''"
    assert _loaded_after(code, ("importlib.metadata",)) == ["importlib.metadata"]


@pytest.mark.slow
def test_building_and_stepping_envs_loads_no_report_or_parquet_modules():
    """The single and the vector env, built, reset and stepped, load none of pyarrow,
    matplotlib, pandas, tqdm, scipy.signal (the AR(1) and EWMA filters of an episode build
    are compiled, ``sim.iir1``) or scipy.special (the token tables' normal quantiles ship
    with the package, ``regimes.normal_quantiles``)."""
    code = """
import gymnasium as gym
import numpy as np
import diloco_gym
env = gym.make("DiLoCoSync-v0")
env.reset(seed=0)
for _ in range(20):
    env.step(env.action_space.sample())
venv = gym.make_vec("DiLoCoSync-v0", num_envs=4, vectorization_mode="vector_entry_point")
venv.reset(seed=0)
for _ in range(20):
    venv.step(np.zeros(4, dtype=np.int64))
for regime in diloco_gym.REGIMES:
    gym.make(diloco_gym.ENV_IDS[regime]).reset(seed=1)
"""
    assert _loaded_after(code, NOT_FOR_THE_ENV + ("scipy.signal", "scipy.special")) == []


def test_loaders_import_and_read_csv_without_pyarrow(tmp_path):
    """Without pyarrow installed, the loaders module imports and reads CSV traces. (pandas 3
    imports pyarrow itself when it is installed, so its absence is what is checked here.)"""
    path = tmp_path / "small.csv"
    path.write_text("# duration_s=3.0\narrival_s,prompt_tokens,output_tokens\n0.5,10,1\n")
    code = f"""
sys.modules["pyarrow"] = None  # as on an install without the parquet extra
from diloco_gym.sim.loaders import load_trace
assert load_trace({str(path)!r}).prompt_tokens.tolist() == [10]
"""
    assert _loaded_after(code, ("pyarrow",)) == ["pyarrow"]  # the None placeholder only


@pytest.fixture
def parquet_file(tmp_path: Path) -> Path:
    pytest.importorskip("pyarrow")
    path = tmp_path / "small.parquet"
    save_native(
        Trace(
            arrival_s=np.array([0.5, 1.0, 2.0]),
            prompt_tokens=np.array([10, 20, 30]),
            output_tokens=np.array([1, 2, 3]),
            duration_s=3.0,
            name="small",
        ),
        path,
    )
    return path


def _without_pyarrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import pyarrow`` fail in this process, as on an install without the extra."""
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)


@pytest.mark.parametrize("load", [load_native, load_trace], ids=["load_native", "load_trace"])
def test_parquet_load_without_pyarrow_names_the_file_and_the_extra(parquet_file, monkeypatch, load):
    _without_pyarrow(monkeypatch)
    with pytest.raises(ModuleNotFoundError) as info:
        load(parquet_file)
    msg = str(info.value)
    assert info.value.name == "pyarrow"
    assert str(parquet_file) in msg
    assert 'pip install "diloco-gym[parquet]"' in msg
    assert "\n" not in msg
    # The command line reports it as one line with exit status 1, not as an internal error.
    code, line = exit_status(info.value)
    assert code == 1 and line == msg


def test_parquet_save_without_pyarrow_is_a_clear_error(tmp_path, monkeypatch):
    _without_pyarrow(monkeypatch)
    path = tmp_path / "out.pq"
    trace = Trace(
        arrival_s=np.array([0.5]),
        prompt_tokens=np.array([10]),
        output_tokens=np.array([1]),
        duration_s=1.0,
        name="one",
    )
    with pytest.raises(
        ModuleNotFoundError,
        match=r"writing Parquet traces needs pyarrow.*"
        r'pip install "diloco-gym\[parquet\]"',
    ):
        save_native(trace, path)
    assert not path.exists()
    # CSV needs no pyarrow.
    save_native(trace, tmp_path / "out.csv")
    assert load_native(tmp_path / "out.csv") == trace


def test_parquet_round_trip_with_pyarrow(parquet_file):
    """With the extra installed, the lazy import still reads what it wrote."""
    trace = load_native(parquet_file)
    assert trace.duration_s == 3.0
    assert trace.arrival_s.tolist() == [0.5, 1.0, 2.0]


@pytest.mark.slow
def test_report_keeps_the_callers_matplotlib_backend(tmp_path):
    """Writing a report (figures included) neither switches the calling process's backend
    nor goes through pyplot."""
    code = f"""
import matplotlib
matplotlib.use("svg")
before = matplotlib.get_backend()
from diloco_gym.eval.report import ReportConfig, run_protocol, write_report
res = run_protocol(ReportConfig(regimes=["bursty"], agents=["fixed-512", "offline-oracle"],
                                seeds=2, draws=20), progress=False)
out = write_report(res, {str(tmp_path / "rep")!r})
pngs = sorted(p.name for p in out.glob("*.png"))
assert pngs and all(p.read_bytes()[:8] == b"\\x89PNG\\r\\n\\x1a\\n" for p in out.glob("*.png"))
after = matplotlib.get_backend()
assert before == after == "svg", (before, after)
"""
    assert _loaded_after(code, ("matplotlib.pyplot",)) == []


#: Which layers each layer's modules may import (CONTRIBUTING.md, "Layout of the code"):
#: sim -> envs -> agents ->
#: eval -> rl/live/lm -> scale -> cli. ``sim`` is the simulated world with no Gymnasium;
#: ``errors``, ``tables``, ``backends`` (the executors), ``io`` (atomic writes, JSON of numpy
#: values, a free port) and ``text`` (numbers as text) are leaf modules any layer may use;
#: they import nothing of the project. A key is a sub-package of ``diloco_gym`` (or a
#: top-level module's name); its own modules may always import each other.
_BASE = {"errors", "tables", "backends", "io", "text"}
LAYER_RULES = {
    "errors": {"errors"},
    "tables": {"tables"},
    "backends": {"backends"},
    "io": {"io"},
    "text": {"text"},
    "sim": {"sim"} | _BASE,
    "envs": {"sim", "envs"} | _BASE,
    "agents": {"sim", "envs", "agents"} | _BASE,
    "eval": {"sim", "envs", "agents", "eval"} | _BASE,
    "rl": {"sim", "envs", "agents", "eval", "rl"} | _BASE,
    # live also runs the deployable controller in the loop of a live replay (closed loop)
    "live": {"sim", "envs", "agents", "eval", "deploy", "live"} | _BASE,
    "lm": {"sim", "envs", "agents", "eval", "lm"} | _BASE,
    "scale": {"sim", "envs", "agents", "eval", "rl", "scale"} | _BASE,
    # the Python API (diloco_gym.evaluate) and the public wrappers: the protocol's own code
    "api": {"sim", "envs", "agents", "eval", "api"} | _BASE,
    "wrappers": {"sim", "envs", "eval", "wrappers"} | _BASE,
    # the deployable controller (an agent in a real deployment's loop): the env's rules
    # and the agents, nothing of the evaluation
    "deploy": {"sim", "envs", "agents", "deploy"} | _BASE,
    # the command line's shared parts: any layer below the command line itself
    "commands": {"sim", "envs", "agents", "eval", "rl", "live", "lm", "scale", "commands"} | _BASE,
}


def _imported_diloco_modules(path: Path) -> set[str]:
    """The ``diloco_gym...`` modules a source file imports (any scope; docstrings ignored)."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("diloco_gym"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("diloco_gym"):
            assert node.module is not None
            if node.module == "diloco_gym":
                found.update(f"diloco_gym.{a.name}" for a in node.names)
            else:
                found.add(node.module)
    return found


def _layer_files(layer: str) -> list[Path]:
    module = ROOT / "diloco_gym" / f"{layer}.py"
    if module.is_file():
        return [module]
    folder = ROOT / "agents" if layer == "agents" else ROOT / "diloco_gym" / layer
    return sorted(folder.rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(LAYER_RULES))
def test_layers_import_only_the_layers_below(layer: str) -> None:
    """Every import (module level or inside a function) of a layer's modules names a layer
    below it or its own; the offending edges are listed when one does not."""
    allowed = LAYER_RULES[layer]
    files = _layer_files(layer)
    assert files, f"no modules found for layer {layer!r}"
    bad = []
    for path in files:
        for mod in _imported_diloco_modules(path):
            parts = mod.split(".")
            # The package root itself (``import diloco_gym``: it registers the env ids)
            # loads only sim and envs, so any layer allowed envs may import it.
            target = parts[1] if len(parts) > 1 else "envs"
            if target not in allowed:
                bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, f"layer rule of {layer!r} broken:\n" + "\n".join(sorted(bad))


def test_sim_layer_does_not_import_gymnasium() -> None:
    import ast

    for path in sorted((ROOT / "diloco_gym" / "sim").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.split(".")[0] == "gymnasium" for n in names), path


def _package_modules() -> dict[str, Path]:
    """Every module of the package by dotted name (the agents from the top-level folder)."""
    found = {}
    for path in sorted((ROOT / "diloco_gym").rglob("*.py")) + sorted(
        (ROOT / "agents").glob("*.py")
    ):
        if path.is_relative_to(ROOT / "agents"):
            parts = ["diloco_gym", "agents", *path.relative_to(ROOT / "agents").parts]
        else:
            parts = list(path.relative_to(ROOT).parts)
        parts[-1] = parts[-1][:-3]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _import_edges(name: str, path: Path, modules: dict) -> list[tuple[str, str | None]]:
    """``(module, imported name or None)`` for every project import of one module, any
    scope, relative imports resolved; ``from pkg import mod`` counts as importing ``mod``."""
    import ast

    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    edges: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            edges += [(a.name, None) for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([mod] if mod else []))
            if mod not in modules:
                continue
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                edges.append((sub, None) if sub in modules else (mod, alias.name))
    return [(m, n) for m, n in edges if m != name]


@pytest.mark.slow
def test_no_private_name_is_imported_from_another_module() -> None:
    """A leading underscore means "this module's own": no module imports one from another."""
    modules = _package_modules()
    bad = [
        f"{name} imports {mod}.{imported}"
        for name, path in modules.items()
        for mod, imported in _import_edges(name, path, modules)
        if imported is not None and imported.startswith("_") and not imported.startswith("__")
    ]
    assert not bad, "private names imported across modules:\n" + "\n".join(sorted(bad))


def test_the_import_graph_has_no_circle() -> None:
    """No two modules import each other, directly or through others (function-local imports
    included: a circle closed inside a function is still a circle). A package's
    ``__init__`` re-exporting its own modules is not a circle of its modules."""
    modules = _package_modules()
    graph = {
        name: {
            mod
            for mod, _ in _import_edges(name, path, modules)
            if not (path.name == "__init__.py" and mod.startswith(name + "."))
            and not name.startswith(mod + ".")  # a module importing its own package
        }
        for name, path in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_can_fail(tmp_path, monkeypatch) -> None:
    """The two graph checks see a circle and a private import when there is one."""
    pkg = tmp_path / "diloco_gym"
    (pkg / "sim").mkdir(parents=True)
    (tmp_path / "agents").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sim" / "__init__.py").write_text("")
    (pkg / "sim" / "a.py").write_text("def f():\n    from diloco_gym.sim.b import _g\n")
    (pkg / "sim" / "b.py").write_text("from . import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="diloco_gym.sim.a <-> diloco_gym.sim.b"):
        test_the_import_graph_has_no_circle()
    with pytest.raises(AssertionError, match="diloco_gym.sim.a imports diloco_gym.sim.b._g"):
        test_no_private_name_is_imported_from_another_module()
