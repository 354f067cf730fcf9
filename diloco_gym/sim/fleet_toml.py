"""The fleet configuration file (TOML; docs/fleet.md "Configuration file"): a ``[fleet]``
table of :class:`~diloco_gym.sim.fleet.FleetParams` keys, ``[[site]]`` tables of
:class:`~diloco_gym.sim.fleet.SiteConfig` keys and an optional ``[env]`` table of
``EnvParams`` keywords. Every error is one line naming the file and the table/key."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from diloco_gym.sim.fleet import (
    FleetConfigError,
    FleetParams,
    SiteConfig,
    check_site_count,
    short_repr,
)
from diloco_gym.sim.limits import LimitError

__all__ = ["fleet_from_dict", "load_fleet_toml"]

_FLEET_KEYS = {f.name for f in fields(FleetParams)} - {"sites"}
_SITE_KEYS = {f.name for f in fields(SiteConfig)}
_INT_KEYS = {"bits", "bits_options", "fragments", "overlap_steps", "model_version", "quorum"}
_LIST_KEYS = {"bits_options", "link_levels", "link_probs"}
_SITE_PATHS = ("trace", "calibration", "link_trace")
_SITE_NUMBERS = (
    "start_s",
    "target_rate_rps",
    "target_utilization",
    "link_gbps",
    "latency_ms",
    "delay_max_s",
    "compute_speed",
)
_STR_KEYS = {"mode", "timing", "traffic_common"}


def _number(where: str, key: str, v: Any, integer: bool = False) -> Any:
    if integer:
        if not isinstance(v, int) or isinstance(v, bool):
            raise FleetConfigError(f"{where}: key {key!r} must be an integer, got {short_repr(v)}")
        return v
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise FleetConfigError(f"{where}: key {key!r} must be a number, got {short_repr(v)}")
    try:
        value = float(v)
    except OverflowError:  # a 400-digit integer
        value = math.inf
    if not math.isfinite(value):
        raise FleetConfigError(f"{where}: key {key!r} must be a finite number, got {short_repr(v)}")
    return value


def fleet_from_dict(
    data: dict[str, Any], where: str = "fleet", base_dir: Path | None = None
) -> tuple[FleetParams, dict[str, Any]]:
    """A :class:`FleetParams` from a parsed configuration (the TOML layout of
    docs/fleet.md): a ``[fleet]`` table, ``[[site]]`` tables, and an optional ``[env]``
    table of :class:`~diloco_gym.envs.params.EnvParams` keywords, returned as the second
    element. ``where`` names the source in errors; relative trace paths resolve against
    ``base_dir``."""
    unknown = set(data) - {"fleet", "site", "env"}
    if unknown:
        raise FleetConfigError(
            f"{where}: unknown table(s) {sorted(unknown)}; expected [fleet], [[site]], [env]"
        )
    ft = data.get("fleet", {})
    if not isinstance(ft, dict):
        raise FleetConfigError(f"{where}: [fleet] must be a table")
    bad = set(ft) - _FLEET_KEYS
    if bad:
        raise FleetConfigError(
            f"{where}: [fleet] has unknown key(s) {sorted(bad)}; valid: {sorted(_FLEET_KEYS)}"
        )
    kw: dict[str, Any] = {}
    for k, v in ft.items():
        if k in _STR_KEYS:
            if not isinstance(v, str):
                raise FleetConfigError(f"{where}: [fleet] key {k!r} must be a string, got {v!r}")
            kw[k] = v
        elif k in _LIST_KEYS:
            what = "integers" if k in _INT_KEYS else "numbers"
            if not isinstance(v, list):
                raise FleetConfigError(
                    f"{where}: [fleet] key {k!r} must be a list of {what}, got {v!r}"
                )
            kw[k] = tuple(_number(f"{where}: [fleet]", k, b, integer=k in _INT_KEYS) for b in v)
        else:
            kw[k] = _number(f"{where}: [fleet]", k, v, integer=k in _INT_KEYS)
    sites_raw = data.get("site")
    if sites_raw is not None:
        if not isinstance(sites_raw, list) or not sites_raw:
            raise FleetConfigError(f"{where}: [[site]] must be a non-empty array of tables")
        check_site_count(len(sites_raw), f"{where}: [[site]] tables")
        sites = []
        for i, st in enumerate(sites_raw):
            sites.append(_site_from_table(st, f"{where}: [[site]] #{i + 1}", i, base_dir))
        kw["sites"] = tuple(sites)
    env = data.get("env", {})
    if not isinstance(env, dict):
        raise FleetConfigError(f"{where}: [env] must be a table")
    try:
        return FleetParams(**kw), dict(env)
    except FleetConfigError as exc:
        raise FleetConfigError(f"{where}: [fleet]: {exc}") from None


def _site_from_table(st: Any, w: str, i: int, base_dir: Path | None) -> SiteConfig:  # noqa: C901 - one check per site key, in sequence
    """One ``[[site]]`` table (``w`` names it in errors; ``i`` its position)."""
    if not isinstance(st, dict):
        raise FleetConfigError(f"{w} must be a table")
    bad = set(st) - _SITE_KEYS
    if bad:
        raise FleetConfigError(f"{w} has unknown key(s) {sorted(bad)}; valid: {sorted(_SITE_KEYS)}")
    skw: dict[str, Any] = {"name": st.get("name", f"site{i}")}
    if not isinstance(skw["name"], str) or not skw["name"]:
        raise FleetConfigError(f"{w}: key 'name' must be a non-empty string")
    for key in _SITE_PATHS:
        if key in st:
            if not isinstance(st[key], str):
                raise FleetConfigError(f"{w}: key {key!r} must be a path string")
            # ``${VAR}`` in a path is expanded (e.g. a directory of downloaded traces)
            path = Path(os.path.expandvars(st[key]))
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            skw[key] = str(path)
    if "trace" in st:
        skw["regime"] = st.get("regime")
    elif "regime" in st:
        skw["regime"] = st["regime"]
    if skw.get("regime") is not None and not isinstance(skw["regime"], str):
        raise FleetConfigError(f"{w}: key 'regime' must be a regime name string")
    for k in _SITE_NUMBERS:
        if k in st:
            skw[k] = _number(w, k, st[k])
    if "sidecar" in st:
        sc = st["sidecar"]
        if not isinstance(sc, dict):
            raise FleetConfigError(f"{w}: key 'sidecar' must be a table")
        skw["sidecar"] = tuple(
            (str(k), _number(f"{w} sidecar", k, v)) for k, v in sorted(sc.items())
        )
    try:
        return SiteConfig(**skw)
    except FleetConfigError as exc:
        raise FleetConfigError(f"{w}: {exc}") from None


def load_fleet_toml(path: str | Path) -> tuple[FleetParams, dict[str, Any]]:
    """Read a fleet configuration TOML file (:func:`fleet_from_dict`); every error is one
    line naming the file and the table/key."""
    from diloco_gym.sim import parsing

    p = Path(path)
    try:
        text = parsing.read_text(p)
    except FileNotFoundError:
        raise FleetConfigError(f"{p}: fleet configuration file not found") from None
    except LimitError as exc:
        raise FleetConfigError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetConfigError(f"{p}: cannot read the fleet configuration ({exc})") from None
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10: the same parser as the package tomli
        import tomli as tomllib
    try:
        data = parsing.parse_toml(text, str(p))
    except LimitError as exc:
        raise FleetConfigError(str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise FleetConfigError(f"{p}: not valid TOML ({exc})") from None
    return fleet_from_dict(data, where=str(p), base_dir=p.parent)
