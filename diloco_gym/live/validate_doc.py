"""The output of ``diloco-gym validate``: a JSON document checked against its schema
(``diloco_gym/data/validate.schema.json``), a Markdown page and its figures.

Writes are atomic (a temporary file renamed over the target). A run that stops early
writes what it measured so far with ``"complete": false`` and the ``error``, to
``NAME.partial.json`` beside ``--out NAME.json``, never over a complete file.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from diloco_gym.io import json_default, write_text_atomic
from diloco_gym.live.document import finite

__all__ = [
    "SCHEMA_NAME",
    "load_schema",
    "validate_document",
    "write_outputs",
    "markdown_page",
    "jsonable",
]

SCHEMA_NAME = "validate.schema.json"


def jsonable(x: Any) -> Any:
    """``x`` with numpy scalars and arrays as Python values, non-finite floats as None
    (:func:`~diloco_gym.live.document.finite`), keys as strings and any other value as its
    ``str`` (:func:`~diloco_gym.io.json_default`)."""
    return json.loads(json.dumps(finite(x), default=json_default, allow_nan=False))


@cache
def load_schema() -> dict:
    """The validation document's JSON Schema (draft 2020-12)."""
    path = Path(__file__).resolve().parent.parent / "data" / SCHEMA_NAME
    return json.loads(path.read_text())


def validate_document(document: dict, where: str = "document") -> None:
    """Check ``document`` against the schema.

    Raises:
        ValueError: one line naming ``where`` and the first offending field.
    """
    from jsonschema import Draft202012Validator

    errors = sorted(
        Draft202012Validator(load_schema()).iter_errors(document), key=lambda e: list(e.path)
    )
    if errors:
        err = errors[0]
        field = "/".join(str(p) for p in err.path) or "(top level)"
        raise ValueError(f"{where}: field {field}: {err.message.splitlines()[0][:200]}")


def write_outputs(document: dict, out: str | os.PathLike[str]) -> list[Path]:
    """Write the document (``out``, or ``NAME.partial.json`` beside it when incomplete),
    and for a complete one its Markdown page (``NAME.md``) and figures
    (``NAME_fidelity.png``, ``NAME_verdicts.png``); returns the paths written.

    Raises:
        ValueError: a complete document that does not follow the schema (nothing written).
    """
    path = Path(out)
    doc = jsonable(document)
    if not doc.get("complete"):
        partial = path.with_name(path.stem + ".partial.json")
        write_text_atomic(partial, json.dumps(doc, indent=1, allow_nan=False) + "\n")
        return [partial]
    validate_document(doc, str(path))
    written = [path]
    write_text_atomic(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")
    figures = _figures(doc, path)
    md = path.with_suffix(".md")
    write_text_atomic(
        md, "\n".join(markdown_page(doc, {k: p.name for k, p in figures.items()})) + "\n"
    )
    stale = path.with_name(path.stem + ".partial.json")
    if stale.exists():
        stale.unlink()
    return written + [md] + list(figures.values())


def _figures(doc: dict, path: Path) -> dict[str, Path]:
    from diloco_gym.live import fidelity as fid
    from diloco_gym.live import verdict_stats as ver

    out: dict[str, Path] = {}
    if doc.get("fidelity"):
        fig = path.with_name(path.stem + "_fidelity.png")
        fid.plot_fidelity(_fidelity_block(doc), fig)
        out["fidelity"] = fig
    if doc.get("verdicts"):
        fig = path.with_name(path.stem + "_verdicts.png")
        ver.plot_verdicts(doc["verdicts"], fig)
        out["verdicts"] = fig
    return out


def _fidelity_block(doc: dict) -> dict:
    """The fidelity block with the calibration setting (in sample) as its first entry."""
    block = dict(doc["fidelity"])
    cal = doc.get("calibration")
    if cal and cal.get("rows"):
        block["calibration"] = {
            "name": f"{cal['source']} U={cal['utilization']:g}",
            **cal,
        }
    return block


def markdown_page(doc: dict, figures: dict[str, str] | None = None) -> list[str]:
    """The validation's Markdown page: the setup, then one section per mode."""
    from diloco_gym.live import fidelity as fid
    from diloco_gym.live import verdict_stats as ver

    figures = figures or {}
    cap = doc.get("capacity", {})
    ep = doc.get("endpoint", {})
    lines = [
        "# Simulator fidelity against a real engine",
        "",
        f"Command: `{doc.get('command', '')}`",
        "",
        f"Started {doc.get('started_utc', '?')}, took {doc.get('elapsed_s', 0) / 60:.1f} min "
        f"(real time: each window is replayed in its own length).",
        "",
        f"Engine: {ep.get('engine', ep.get('kind', '?'))} at {ep.get('url', '?')}, model "
        f"`{ep.get('model', '?')}`; probed capacity "
        + (f"{cap['capacity_rps']:.2f} req/s." if cap.get("capacity_rps") else "not probed."),
    ]
    cal = doc.get("calibration")
    if cal and cal.get("source") == "file":
        lines += [
            "",
            f"The sidecar model is a calibration file's fit (not refitted here); SLO "
            f"{cal['slo_ms']:.0f} ms ({cal['slo_source']}).",
        ]
    elif cal:
        fs = cal["fitted_sidecar"]
        lines += [
            "",
            "## Calibration",
            "",
            f"Fitted on {cal['source']} at {cal['utilization']:g} of the capacity "
            f"({cal['rate_rps']:.2f} req/s), {cal['repeats']} sync/control pairs of "
            f"{cal['duration_s']:g} s. SLO {cal['slo_ms']:.0f} ms ({cal['slo_source']}). "
            f"Fitted: slots {fs['slots']:.2f}, sync_slowdown {fs['sync_slowdown']:.3f}, "
            f"decode {fs['decode_ms_per_token']:.2f} ms/token, TTFT {fs['ttft_ms']:.1f} ms.",
        ]
    if doc.get("fidelity"):
        lines += [""]
        lines += fid.markdown_section(_fidelity_block(doc))
        if "fidelity" in figures:
            lines += ["", f"![predicted against measured]({figures['fidelity']})"]
    if doc.get("verdicts"):
        lines += ["", "## Verdicts replayed live, and the closed loop", ""]
        lines += ver.markdown_section(doc["verdicts"])
        if "verdicts" in figures:
            lines += ["", f"![simulated against live costs]({figures['verdicts']})"]
    return lines
