"""Loading calibration files: :func:`load_calibration` (the shipped reference, a user's file
merged over it entry by entry) and the :class:`Calibration` it returns."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from diloco_gym.envs.episode import min_episode_seconds
from diloco_gym.envs.params import EnvParams
from diloco_gym.eval.calibration.consistency import check_consistency
from diloco_gym.eval.calibration.schema import (
    CalibrationFileError,
    check_chains,
    parse_json,
    read_json_file,
    validate_calibration,
)
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.sim.sidecar import SidecarParams


@dataclass(frozen=True)
class Calibration:
    """Real-sidecar measurements per regime.

    Attributes:
        source: where the numbers come from.
        regimes: regime -> {"p95_high_low", "p95_sync_ratio", optional
            "pressure_latency_corr", optional "calibrated_on"}.
        path: the file it was read from.
    """

    source: str
    regimes: dict
    path: str
    fitted_sidecar: SidecarParams | None = None
    user_regimes: tuple[str, ...] = ()
    complete: bool = True
    #: why the fitted sidecar lies outside the model's range (its nominal service time
    #: alone reaches the SLO, so every request violates it), or ``None``.
    out_of_range: str | None = None

    def measured_on(self, regime: str) -> str:
        """The regime whose measurements apply to ``regime`` (following ``calibrated_on``)."""
        entry = self.regimes.get(regime, {})
        on = entry.get("calibrated_on", regime)
        return on if on == regime else self.measured_on(on)

    def sidecar_for(self, regime: str) -> SidecarParams | None:
        """Fitted sidecar parameters that apply to ``regime``, if the file has them.

        A live calibration file (``diloco-gym calibrate``) fits the sidecar model to its
        measurements; those parameters drive the simulation of the measured regime and of
        the regimes calibrated on it. ``None`` means: keep the regime's defaults.
        """
        if self.fitted_sidecar is None:
            return None
        return self.fitted_sidecar if self.measured_on(regime) in self.user_regimes else None

    def measured(self, regime: str) -> dict:
        """Measurements that apply to ``regime`` (following ``calibrated_on``)."""
        entry = self.regimes.get(regime)
        if entry is None:
            raise KeyError(
                f"calibration file {self.path} has no entry for regime {regime!r}; "
                f"it has {sorted(self.regimes)}"
            )
        on = entry.get("calibrated_on", regime)
        if on != regime:
            base = dict(self.measured(on))
            base["calibrated_on"] = on
            return base
        return entry


def load_calibration(path: str | Path | None = None, *, allow_empty: bool = False) -> Calibration:
    """Read a calibration file (default: the shipped reference measurements).

    A user file is read strictly (:func:`read_json_file`: UTF-8 with or without a
    byte-order mark, no duplicate keys) and checked for contradictions
    (:func:`check_consistency`). A file that measured nothing (``regimes`` empty: a live run
    interrupted before any request succeeded) is refused unless ``allow_empty`` (it would
    silently stand for the reference's numbers).

    A user file (for example from ``diloco-gym calibrate``) overrides the reference entry by
    entry: regimes it does not measure keep the reference's numbers, and regimes
    calibrated on a regime it does measure (bursty on sync-heavy) follow the new numbers.
    A ``fitted_sidecar`` object in the file is validated and exposed as
    :attr:`Calibration.fitted_sidecar`. Every file is validated against
    ``diloco_gym/data/calibration.schema.json`` (see :class:`CalibrationFileError`).

    Raises:
        CalibrationFileError: (a ``ValueError``) naming the file and field when the file is
            missing, unreadable or malformed.
    """
    if path is None:
        return _read_calibration(None)
    base = _read_calibration(None)
    user = _read_calibration(path)
    if not user.regimes and not allow_empty:
        raise CalibrationFileError(
            user.path,
            "the file measured nothing (no regime has measurements: a live run stopped "
            "before any request succeeded?); leave out the calibration file to use the "
            "shipped reference measurements",
            "regimes",
        )
    regimes = dict(base.regimes)
    regimes.update(user.regimes)
    # The user's entries may point at the reference's (and vice versa): check the merge.
    check_chains(regimes, user.path, user.user_regimes)
    return Calibration(
        user.source,
        regimes,
        user.path,
        user.fitted_sidecar,
        tuple(user.regimes),
        user.complete,
        user.out_of_range,
    )


def _read_calibration(path: str | Path | None) -> Calibration:
    if path is None:
        text = (
            resources.files("diloco_gym")
            .joinpath("data/calibration_reference.json")
            .read_text(encoding="utf-8-sig")
        )
        where = "diloco_gym/data/calibration_reference.json"
        data = parse_json(text, where)
    else:
        where = str(path)
        data = read_json_file(path)
    validate_calibration(data, where)
    check_consistency(data, where)
    fitted = None
    if data.get("fitted_sidecar"):
        try:
            fitted = SidecarParams(**data["fitted_sidecar"])
        except ValueError as exc:  # defensive: the schema's ranges are stricter
            raise CalibrationFileError(where, str(exc), "fitted_sidecar") from exc
        shortest = min(float(getattr(r, "duration_s", 600.0)) for r in REGIMES.values())
        min_s = min_episode_seconds(EnvParams(), fitted)
        if min_s > shortest:
            raise CalibrationFileError(
                where,
                f"{fitted.tail_s:g} s leaves no room for an episode: with it an episode needs "
                f"at least {min_s:.1f} s, the regimes' episodes last {shortest:g} s",
                "fitted_sidecar.tail_s",
            )
    return Calibration(
        str(data["source"]),
        dict(data["regimes"]),
        where,
        fitted,
        tuple(data["regimes"]),
        data.get("complete", True),
        slower_than_slo(fitted, data) if fitted is not None else None,
    )


def slower_than_slo(fitted: SidecarParams, doc: dict) -> str | None:
    """Why a fitted sidecar is outside the model's range, or ``None``: its nominal service
    time for the measured mean request (``metadata.trace``; the TTFT alone when not
    recorded) reaches the SLO, so every request violates it and merges cannot change that
    (for example a server far slower than the SLO)."""
    meta = doc.get("metadata")
    trace = meta.get("trace", {}) if isinstance(meta, dict) else {}
    trace = trace if isinstance(trace, dict) else {}
    prompt = float(trace.get("sent_prompt_tokens_mean") or 0.0)
    output = float(trace.get("sent_output_tokens_mean") or 0.0)
    service_ms = (
        fitted.ttft_ms + fitted.prefill_ms_per_token * prompt + fitted.decode_ms_per_token * output
    )
    if service_ms < fitted.slo_ms:
        return None
    return (
        f"the fitted sidecar serves the measured mean request in {service_ms:,.0f} ms (TTFT "
        f"{fitted.ttft_ms:,.0f} ms), at or above the {fitted.slo_ms:,.0f} ms SLO: every "
        f"request violates it, outside the model's range (a server slower than the SLO)"
    )
