"""Reading and parsing settings, calibration and metadata files within the size limits.

Every loader of a TOML, JSON or YAML file calls these, so that no file, however small, makes
the package recurse without bound, expand without bound or read without bound:

* :func:`read_text`: a file's text, refused past a byte limit before it is read (a FIFO or a
  device is refused unopened);
* :func:`parse_json`, :func:`parse_toml`, :func:`parse_yaml`: the parsed document, whose
  nesting depth is at most ``DILOCO_GYM_MAX_NESTING`` levels (:func:`check_nesting`);
  a document nested too deeply for the parser itself (Python's recursion limit, about
  1,000 levels) is refused the same way, never a ``RecursionError``;
* YAML aliases are allowed (an anchor shared by several grid values is a fair use) but
  counted: the document's values with every alias expanded may be at most
  ``DILOCO_GYM_MAX_YAML_NODES``, checked on the composed node graph before any Python value
  is built (a "billion laughs" file of 1.3 KB stands for 10^9 values), and an alias inside
  its own anchor (a recursive document) is refused.

Each refusal is a :class:`~diloco_gym.sim.limits.LimitError` (a ``ValueError``) with one line
that begins with the file; a syntax error is the parser's own exception
(``json.JSONDecodeError``, ``tomllib.TOMLDecodeError``, ``yaml.YAMLError``), which the
callers word as before. The module imports nothing heavy (the limits, and each parser when
first used).
"""

from __future__ import annotations

import os
import re
import stat
import sys
from typing import Any

from diloco_gym.sim.limits import LIMITS, LimitError, check_limit, limit, limit_env_var

__all__ = [
    "check_nesting",
    "nesting_depth",
    "parse_json",
    "parse_toml",
    "parse_yaml",
    "read_text",
]


def read_text(
    path: str | os.PathLike[str],
    *,
    limit_name: str = "SETTINGS_BYTES",
    encoding: str = "utf-8",
    what: str = "file size in bytes",
) -> str:
    """The text of ``path``, at most limit ``limit_name`` bytes (read no further).

    A FIFO, a device or a socket is refused before it is opened (reading one could hang or
    never end); a directory fails as ``open`` fails.

    Raises:
        LimitError: the file is larger than the limit, or not a regular file.
        OSError: the file cannot be read (missing, a directory, no permission).
        UnicodeDecodeError: the file is not text in ``encoding``.
    """
    where = os.fspath(path)
    info = os.stat(where)
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        raise LimitError(f"{where}: not a regular file (a FIFO, a device or a socket)")
    if stat.S_ISREG(info.st_mode):
        check_limit(limit_name, info.st_size, f"{where}: {what}")
    bound = limit(limit_name)
    with open(where, "rb") as handle:
        # read(n) reserves n bytes first: ask for the size found (one byte more shows growth)
        data = handle.read(info.st_size + 1)
        if len(data) > info.st_size:
            data += handle.read(max(0, bound + 1 - len(data)))
    check_limit(limit_name, len(data), f"{where}: {what}")
    return data.decode(encoding)


def nesting_depth(data: Any) -> int:
    """The nesting depth of a parsed document: 0 for a scalar, 1 for a flat table or list,
    one more for each level of tables and lists inside (iterative: no recursion)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list | tuple):
            children = value
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


def check_nesting(data: Any, where: str) -> Any:
    """``data``, if its :func:`nesting_depth` is within ``DILOCO_GYM_MAX_NESTING``.

    Raises:
        LimitError: one line naming ``where`` (the file), the depth and the limit.
    """
    check_limit("NESTING", nesting_depth(data), f"{where}: nesting depth")
    return data


def _too_deep(where: str) -> LimitError:
    """The error for a document the parser itself could not descend (``RecursionError``)."""
    return LimitError(
        f"{where}: nesting depth: nested too deeply to parse (more than Python's recursion "
        f"limit allows); the limit is {limit('NESTING'):,} {LIMITS['NESTING'][1]} "
        f"(set {limit_env_var('NESTING')} to raise it)"
    )


def parse_json(text: str | bytes, where: str, **kwargs: Any) -> Any:
    """``json.loads(text, **kwargs)`` within the nesting limit (:func:`check_nesting`).

    Raises:
        LimitError: nested too deeply (one line naming ``where``).
        json.JSONDecodeError: not valid JSON (and whatever a hook in ``kwargs`` raises).
    """
    import json

    try:
        data = json.loads(text, **kwargs)
    except RecursionError:
        raise _too_deep(where) from None
    return check_nesting(data, where)


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """``tomllib.loads(text)`` within the nesting limit (:func:`check_nesting`).

    Raises:
        LimitError: nested too deeply (one line naming ``where``).
        tomllib.TOMLDecodeError: not valid TOML.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10: the same parser as the package tomli
        import tomli as tomllib
    _check_dotted_keys(text, where)
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise _too_deep(where) from None
    return check_nesting(data, where)


#: One part of a TOML key: bare, or a quoted string on one line.
_TOML_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""
#: A run of dotted key parts (``a.b."c"``), matched whole: each character is scanned once.
_TOML_DOTTED = re.compile(_TOML_KEY_PART + r"(?:[ \t]*\.[ \t]*" + _TOML_KEY_PART + ")*")


def _check_dotted_keys(text: str, where: str) -> None:
    """Refuse a dotted key of more parts than ``DILOCO_GYM_MAX_NESTING`` before ``tomllib``
    sees it: ``a.a.a... = 1`` costs the parser memory quadratic in its parts (a 200 KB line
    of 100,000 parts would take about 40 GB). Only a line with more dots than the limit is
    scanned, in one pass; a quoted value's dots are not counted."""
    bound = limit("NESTING")
    for line in text.split("\n"):
        if line.count(".") <= bound:
            continue
        for match in _TOML_DOTTED.finditer(line):
            if match.group().count(".") > bound:
                parts = len(re.findall(_TOML_KEY_PART, match.group()))
                check_limit("NESTING", parts, f"{where}: nesting depth (a dotted key's parts)")


def parse_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)`` within the nesting limit and the YAML node limit.

    The nodes are counted as they are composed (at most ``DILOCO_GYM_MAX_YAML_NODES``), and
    the composed node graph is checked before any value is constructed: its values with
    every alias expanded (counted without expanding them) at most
    ``DILOCO_GYM_MAX_YAML_NODES``, its depth at most ``DILOCO_GYM_MAX_NESTING``, and no
    alias inside its own anchor.

    Raises:
        LimitError: too many values, nested too deeply, or recursive (one line naming
            ``where``).
        yaml.YAMLError: not valid YAML.
        ImportError: PyYAML is not installed.
    """
    loader = _yaml_loader_class()(text)
    loader.where = where
    try:
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except RecursionError:
        raise _too_deep(where) from None
    return check_nesting(data, where)


_YAML_LOADER: Any = None


def _yaml_loader_class() -> Any:
    """A ``yaml.SafeLoader`` that checks each composed document (:func:`_check_yaml_graph`)
    before constructing it (made on first use: PyYAML is imported only for YAML files)."""
    global _YAML_LOADER
    if _YAML_LOADER is None:
        import yaml

        class LimitedSafeLoader(yaml.SafeLoader):
            where = "<yaml>"
            composed = 0

            def compose_node(self, parent: Any, index: Any) -> Any:
                # each node is counted as it is composed (an alias as one): a long flat list
                # of small values would otherwise build its nodes (hundreds of bytes each)
                # before the graph is checked
                self.composed += 1
                check_limit("YAML_NODES", self.composed, f"{self.where}: YAML values read")
                return super().compose_node(parent, index)

            def compose_document(self) -> Any:
                node = super().compose_document()
                _check_yaml_graph(node, self.where)
                return node

        _YAML_LOADER = LimitedSafeLoader
    return _YAML_LOADER


def _check_yaml_graph(root: Any, where: str) -> None:
    """Count the values of a composed YAML document with every alias expanded, and its
    depth, without expanding anything (each node is visited once; an alias is a node shared
    by several parents). A node reached again while inside itself is a recursive alias."""
    if root is None:
        return
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values expanded, depth)
    inside: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        kids = _yaml_children(node)
        if done:
            inside.discard(key)
            count = 1 + sum(sizes[id(kid)][0] for kid in kids)
            depth = 0
            if node.id != "scalar":
                depth = 1 + max((sizes[id(kid)][1] for kid in kids), default=0)
            check_limit("YAML_NODES", count, f"{where}: YAML values, aliases expanded, so far")
            check_limit("NESTING", depth, f"{where}: nesting depth")
            sizes[key] = (count, depth)
            continue
        if key in sizes:
            continue
        if key in inside:
            raise LimitError(
                f"{where}: a YAML alias refers to a node that contains it (a recursive "
                f"document has no end); write the values out"
            )
        inside.add(key)
        stack.append((node, True))
        stack.extend((kid, False) for kid in kids if id(kid) not in sizes)


def _yaml_children(node: Any) -> list[Any]:
    """The child nodes of a sequence (its items) or a mapping (its keys and values)."""
    if node.id == "mapping":
        return [part for pair in node.value for part in pair]
    if node.id == "sequence":
        return list(node.value)
    return []
