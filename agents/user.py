"""Your own scheduler as an agent: any object with Stable-Baselines3's ``predict``.

An agent argument of ``diloco-gym report`` and ``frontier`` (``--agent``, ``--agents``,
``--budget-agents``, ``--free-agents``) may name Python code instead of a registry name or a
model file:

* ``module:attr`` (``mypkg.sched:MyScheduler``): an importable module (the current
  directory is searched too) and an attribute of it (dotted: ``module:Outer.attr``);
* ``path/to/file.py:attr``: a Python file, loaded as a module (its folder is not added to
  ``sys.path``).

The attribute may be an object with ``predict(observation, state=None, episode_start=None,
deterministic=True) -> (action, state)`` (an instance; a loaded Stable-Baselines3 model,
judged through its policy), a class (instantiated with no arguments), a factory function
(no arguments) returning such an object, or a function ``f(observation) -> action``.
:func:`as_agent` makes one of these an agent (:class:`UserAgent`): it keeps the object's
``name``, ``deployable`` (default ``True``: sealed like the built-in deployable agents,
:func:`diloco_gym.eval.sealed.seal_agents`), ``budget_aware`` and ``attach(context)``.

An agent built from a file is picklable: the file's module stays in ``sys.modules`` under
a name of its own (so pickling by reference works in the process) and is registered with
cloudpickle to travel by value, so a worker process that cannot import the file (a sealed
agent's worker) receives the code with the agent.

Loading runs the named code: name only code you trust (as for any Python you import).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "AgentSpecError",
    "UserAgent",
    "FunctionAgent",
    "is_user_spec",
    "load_user_agent",
    "as_agent",
    "register_object",
    "unregister_object",
    "OBJECT_PREFIX",
    "shipped_user_spec",
]

#: Prefix of the spec under which :func:`register_object` files an agent object of this
#: process (the Python API's ``evaluate(agent_object)``); not a module name (the hyphen).
OBJECT_PREFIX = "python-object:"

#: The default name of :class:`diloco_gym.agents.base.Agent`: a subclass that keeps it is
#: named after the spec's attribute instead.
_BASE_NAME = "agent"

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

#: Agent objects registered in this process by :func:`register_object`.
_OBJECTS: dict[str, Any] = {}


class AgentSpecError(ValueError):
    """An agent argument that names Python code which cannot be made an agent (a missing
    file, a failed import, a missing attribute, an object without ``predict``); the message
    is one line naming the argument and the file."""


def _split(spec: str) -> tuple[str, str] | None:
    """``(module or file, attribute)`` of a ``module:attr`` or ``file.py:attr`` spec."""
    if ":" not in spec:
        return None
    where, attr = spec.rsplit(":", 1)
    return where, attr


def _is_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where or os.sep in where


def is_user_spec(spec: str) -> bool:
    """Whether an agent argument names Python code (``module:attr``, ``file.py:attr``) or
    an object registered in this process (:func:`register_object`), rather than a registry
    name or a model file. Decided from the text alone (nothing is imported)."""
    if not isinstance(spec, str) or spec.endswith(".zip"):
        return False
    if spec.startswith(OBJECT_PREFIX):
        return True
    parts = _split(spec)
    if parts is None:
        return False
    where, attr = parts
    return bool(where) and bool(attr) and (_is_file(where) or bool(_MODULE_NAME.match(where)))


def shipped_user_spec(spec: str, base: Path | None = None) -> str:
    """``spec`` as a process in another working directory reads it: a file's path made
    absolute, a relative one taken relative to ``base`` (default the current directory);
    ``module:attr`` and registered objects unchanged."""
    parts = _split(spec)
    if spec.startswith(OBJECT_PREFIX) or parts is None or not _is_file(parts[0]):
        return spec
    path = Path(parts[0]).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    return f"{path.resolve()}:{parts[1]}"


def register_object(agent: Any) -> str:
    """File an agent object of this process under a spec (``python-object:<name>``) that
    :func:`load_user_agent` (and so the registry's ``make_agent``) resolves here; the
    protocol's configuration then names it like any other agent. Only this process knows
    it: cells run in other processes cannot (``backend="serial"``).

    Raises:
        ValueError: another object is already registered under that name.
    """
    spec = OBJECT_PREFIX + agent.name
    if spec in _OBJECTS and _OBJECTS[spec] is not agent:
        raise ValueError(f"an agent named {agent.name!r} is already registered; rename one")
    _OBJECTS[spec] = agent
    return spec


def unregister_object(spec: str) -> None:
    """Forget an object :func:`register_object` filed (no error when it is not there)."""
    _OBJECTS.pop(spec, None)


def load_user_agent(spec: str) -> UserAgent:
    """The agent a ``module:attr`` or ``file.py:attr`` spec names (:func:`as_agent` of the
    attribute, named after it unless the object has a name), or a registered object.

    Raises:
        AgentSpecError: one line naming the spec and the file (see the class).
    """
    if spec.startswith(OBJECT_PREFIX):
        if spec not in _OBJECTS:
            raise AgentSpecError(
                f"agent {spec!r}: no such object in this process (an agent object given to "
                f"the Python API runs in the process that holds it: backend='serial')"
            )
        return _OBJECTS[spec]
    parts = _split(spec)
    if parts is None or not is_user_spec(spec):
        raise AgentSpecError(
            f"agent {spec!r}: not 'module:attr' or 'path/to/file.py:attr' (an attribute "
            f"of a module or a Python file)"
        )
    where, attr = parts
    module, origin = _load_file(spec, where) if _is_file(where) else _import(spec, where)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(
                n
                for n, v in vars(module).items()
                if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
            )
            hint = f" (it defines: {', '.join(public)})" if public else ""
            raise AgentSpecError(f"agent {spec!r}: {origin} has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    return as_agent(obj, name=attr.rsplit(".", 1)[-1], where=f"agent {spec!r} ({origin})")


def _import(spec: str, name: str) -> tuple[Any, str]:
    """Import module ``name``; the current directory is searched after ``sys.path``."""
    top = name.split(".")[0]

    def missing(exc: ModuleNotFoundError) -> bool:  # the named module, not one it imports
        return exc.name is not None and exc.name.split(".")[0] == top

    failed = f"agent {spec!r}: importing module {name} failed"
    try:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            here = os.getcwd()
            if not missing(exc) or here in sys.path:
                raise
            sys.path.append(here)  # as `python -m` would: a module beside the command
            try:
                module = importlib.import_module(name)
            finally:
                sys.path.remove(here)
            import cloudpickle

            # a worker started without this directory on its path gets the code by value
            cloudpickle.register_pickle_by_value(sys.modules[top])
    except ModuleNotFoundError as exc:
        if missing(exc):
            raise AgentSpecError(
                f"agent {spec!r}: no module named {exc.name!r} (on sys.path or in the current "
                f"directory; a file is given as path/to/file.py:attr)"
            ) from None
        raise AgentSpecError(f"{failed}: {_one(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - the module's own error, reported in one line
        raise AgentSpecError(f"{failed}: {_one(exc)}") from None
    return module, f"module {name}"


def _module_name(path: Path) -> str:
    """The ``sys.modules`` name of a loaded agent file: its stem and a hash of its path."""
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    return f"diloco_gym_user_agent_{stem}_{digest}"


def _load_file(spec: str, where: str) -> tuple[Any, str]:
    """The module of a Python file, loaded once per process (kept in ``sys.modules``)."""
    path = Path(where).expanduser().resolve()
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise AgentSpecError(f"agent {spec!r}: file {where} {what}")
    name = _module_name(path)
    module = sys.modules.get(name)
    if module is not None:
        return module, str(path)
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise AgentSpecError(f"agent {spec!r}: {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: the file's own error
        del sys.modules[name]
        if isinstance(exc, KeyboardInterrupt):
            raise
        where = f"{path}{_line_in(exc, path)}"
        raise AgentSpecError(f"agent {spec!r}: importing {where} failed: {_one(exc)}") from None
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)  # a worker that cannot import it gets the code
    return module, str(path)


def _line_in(exc: BaseException, path: Path) -> str:
    """`` (line N)``: the last line of ``path`` in the exception's traceback."""
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f" (line {exc.lineno})"
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename) == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" (line {line})" if line else ""


def _one(exc: BaseException) -> str:
    """An exception as one line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _required_positional(fn: Any) -> int | None:
    """How many positional arguments ``fn`` needs (``None``: no signature to read)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(
        1 for p in sig.parameters.values() if p.kind in kinds and p.default is inspect._empty
    )


def _has_predict(obj: Any) -> bool:
    return not isinstance(obj, type) and callable(getattr(obj, "predict", None))


def _sb3_policy(obj: Any) -> Any:
    """A Stable-Baselines3 model's policy (the same ``predict``; pickles without the
    model's buffers, optimizer and env); any other object unchanged."""
    if "stable_baselines3" in sys.modules:
        from stable_baselines3.common.base_class import BaseAlgorithm

        if isinstance(obj, BaseAlgorithm):
            return obj.policy
    return obj


def as_agent(obj: Any, name: str | None = None, where: str | None = None) -> UserAgent:
    """``obj`` as an agent the protocol runs (:class:`UserAgent`).

    Args:
        obj: an object with ``predict`` (an instance, a Stable-Baselines3 model or policy),
            a class (instantiated with no arguments), a factory function (no arguments)
            returning such an object, or a function ``f(observation) -> action``. An
            :class:`UserAgent` is returned as it is.
        name: the agent's name when the object has none (an object's own ``name``
            attribute wins, unless it is the base class's default ``"agent"``); by default
            the class's or function's name.
        where: how errors name the object (default: its ``repr``).

    Raises:
        AgentSpecError: the object cannot be made an agent (one line saying why).
    """
    if isinstance(obj, UserAgent):
        return obj
    where = where or f"agent {obj!r}"
    label = getattr(obj, "__name__", None) or type(obj).__name__
    made = obj
    if isinstance(obj, type):
        if _required_positional(obj) not in (0, None):
            raise AgentSpecError(
                f"{where}: class {label} needs constructor arguments; give an instance or "
                f"a factory function instead"
            )
        made = _call(obj, where, f"{label}()")
    elif not _has_predict(obj) and callable(obj):
        needs = _required_positional(obj)
        if needs == 0:  # a factory
            made = _call(obj, where, f"{label}()")
        elif needs == 1:
            made = FunctionAgent(obj)
        else:
            raise AgentSpecError(
                f"{where}: function {label} takes {needs} positional arguments; an agent "
                f"function takes the observation only (f(observation) -> action), a "
                f"factory none"
            )
    made = _sb3_policy(made)
    if not _has_predict(made):
        got = f"{label}() returned {type(made).__name__}" if made is not obj else label
        raise AgentSpecError(
            f"{where}: {got} has no predict(observation, state, episode_start, "
            f"deterministic) method (give an object with one, a class, a factory or a "
            f"function f(observation) -> action)"
        )
    own = getattr(made, "name", None)
    if not isinstance(own, str) or not own or (own == _BASE_NAME and name):
        own = name or label
    return UserAgent(made, own)


def _call(fn: Any, where: str, what: str) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the user's constructor: one line
        raise AgentSpecError(f"{where}: {what} failed: {_one(exc)}") from None


def _restore(blob: bytes, name: str) -> UserAgent:
    """Unpickle a :class:`UserAgent` (its object travels as cloudpickle bytes)."""
    import cloudpickle

    return UserAgent(cloudpickle.loads(blob), name)


class FunctionAgent:
    """A function ``f(observation) -> action`` with Stable-Baselines3's ``predict``: one
    observation ``(17,)`` gives one action, a batch ``(n, 17)`` one action per row."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.name = getattr(fn, "__name__", "function")

    def predict(
        self,
        observation: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = True,
    ) -> tuple[np.ndarray, Any]:
        obs = np.asarray(observation, dtype=np.float32)
        if obs.ndim == 1:
            return np.asarray(self.fn(obs), dtype=np.int64).reshape(()), state
        return np.array([int(np.asarray(self.fn(o)).reshape(-1)[0]) for o in obs]), state


class UserAgent:
    """A user's scheduler behind the runner's agent interface (``name``, ``deployable``,
    ``budget_aware``, ``attach``, ``predict``), whatever object implements it.

    ``deployable`` is the object's own flag (default ``True``: it runs sealed in a worker
    process); a non-deployable object that defines ``attach_episode(env, episode_seed)``
    gets it (:class:`UserAgentWithEpisode`). Pickled with cloudpickle (:func:`_restore`),
    so an object whose class was loaded from a file travels by value.
    """

    def __new__(cls, inner: Any, name: str) -> UserAgent:
        wants = not bool(getattr(inner, "deployable", True)) and callable(
            getattr(inner, "attach_episode", None)
        )
        if cls is UserAgent and wants:
            cls = UserAgentWithEpisode
        return super().__new__(cls)

    def __init__(self, inner: Any, name: str) -> None:
        self.inner = inner
        self.name = str(name)
        self.deployable = bool(getattr(inner, "deployable", True))
        self.budget_aware = bool(getattr(inner, "budget_aware", False))
        size = getattr(inner, "obs_size", None)
        if size is not None:
            self.obs_size = size

    def attach(self, context: Any) -> None:
        """Hand the episode's public context to the object, when it takes one."""
        if callable(getattr(self.inner, "attach", None)):
            self.inner.attach(context)

    def predict(
        self,
        observation: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = True,
    ) -> tuple[Any, Any]:
        """The object's ``predict``."""
        return self.inner.predict(
            observation, state=state, episode_start=episode_start, deterministic=deterministic
        )

    def __reduce__(self) -> tuple[Any, tuple[bytes, str]]:
        import cloudpickle

        return _restore, (cloudpickle.dumps(self.inner), self.name)

    def __repr__(self) -> str:
        return f"UserAgent({self.name!r}, {type(self.inner).__name__})"


class UserAgentWithEpisode(UserAgent):
    """A non-deployable :class:`UserAgent` whose object asks for the episode."""

    def attach_episode(self, env: Any, episode_seed: int) -> None:
        self.inner.attach_episode(env, episode_seed)
