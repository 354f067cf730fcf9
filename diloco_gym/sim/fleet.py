"""The fleet model: N sites, payload-timed syncs, Streaming DiLoCo fragments, quantised
payloads (the env: :mod:`diloco_gym.envs.fleet`; the file: :mod:`~diloco_gym.sim.fleet_toml`).

Sources of the formulas (docs/fleet.md states them with their defaults):

* DiLoCo (Douillard et al., arXiv 2311.08105): an outer sync all-reduces the whole model.
* Streaming DiLoCo (Douillard et al., arXiv 2501.18512): the model is split into ``F``
  fragments synchronised one at a time, staggered, optionally overlapped with ``tau``
  inner steps, with low-bit payloads.
* OpenDiLoCo (arXiv 2407.07852, fp16 all-reduce) and INTELLECT-1 (arXiv 2412.01152,
  int8 all-reduce across continents): the sync time follows from payload and bandwidth.
* Ring all-reduce, alpha-beta model (Thakur, Rabenseifner and Gropp, "Optimization of
  collective communication operations in MPICH", IJHPCA 2005): each of ``N`` participants
  sends and receives ``2 (N - 1) / N`` times the payload in ``2 (N - 1)`` steps, so
  ``T = 2 (N - 1) / N * payload / B_slowest + 2 (N - 1) * alpha``.

Plain arithmetic on the configuration; what a sync costs a site's serving is the sidecar
model (:mod:`diloco_gym.sim.sidecar`) with the slowdown of :func:`sync_slowdown`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from diloco_gym.sim.fleet_links import check_fleet_links
from diloco_gym.sim.limits import LimitError, check_limit
from diloco_gym.sim.rounds import TIMINGS
from diloco_gym.sim.sidecar import SidecarParams

__all__ = [
    "SiteConfig",
    "FleetParams",
    "BITS",
    "MODES",
    "payload_bytes",
    "ring_allreduce_seconds",
    "ring_latency_seconds",
    "fragment_corridor",
    "sync_plan",
    "SyncPlan",
    "sync_slowdown",
    "streamed_slowdown",
    "progress_factor",
    "fragment_work_seconds",
    "MODEL_VERSIONS",
    "FleetConfigError",
    "site_calibration",
]

#: Payload precisions a sync may use (bits per parameter).
BITS = (32, 16, 8, 4)
#: How a fragment is sent: ``full`` (whole link, short window) or ``streamed`` (a share of
#: the link over an overlap window of ``overlap_steps`` inner steps).
MODES = ("full", "streamed")
#: Versions of the fleet model (:attr:`FleetParams.model_version`): 0 is the model of
#: ``DiLoCoFleet-v0``; 1 (``DiLoCoFleet-v1``) charges each site its own link share, charges
#: a streamed sync's host part by its work, stalls the learners during a full-mode sync,
#: discounts a fragment's credit by its own staleness and times the ring's latency by its
#: hops (docs/fleet.md, "What v1 changes").
MODEL_VERSIONS = (0, 1)


class FleetConfigError(ValueError):
    """A fleet configuration (TOML file or dict) with a bad table, key or value."""


@dataclass(frozen=True)
class SiteConfig:
    """One site of the fleet.

    Attributes:
        name: label (tables, observation feature names).
        regime: synthetic regime name (its own seed per episode; see the env).
        trace: path of a real trace file (instead of ``regime``); replayed at ``start_s``
            (``None``: a window drawn per episode seed) and rescaled to ``target_rate_rps``
            (``None``: as recorded).
        start_s / target_rate_rps: see ``trace``.
        target_utilization: instead of ``target_rate_rps``, the rate that brings the
            trace's offered work to this share of the site's serving capacity
            (:func:`~diloco_gym.sim.regimes.replay_rate_scale`).
        sidecar: overrides of :class:`~diloco_gym.sim.sidecar.SidecarParams` for this site's
            serving (default: the regime's sidecar).
        link_gbps: the site's link to the fleet, Gbit/s.
        latency_ms: the site's one-way access latency, ms: from the site to the network
            that joins the sites. Model v1 (:attr:`FleetParams.model_version`) charges one
            ring hop between sites ``i`` and ``j`` ``latency_i + latency_j``
            (:func:`ring_latency_seconds`); model v0 charges every hop the largest site's
            latency.
        calibration: a live calibration file (``diloco-gym calibrate``): its
            ``fitted_sidecar`` is this site's sidecar (before the ``sidecar`` overrides) and
            the interference function its ``interference`` block fitted
            (``calibrate --link-shares``) replaces the fleet's ``host_share`` and
            ``share_exponent`` for this site (:func:`site_calibration`).
        delay_max_s: per-site timing only (``timing = "rounds"``): the site is a
            straggler, ready to contribute to each round only after a start delay drawn
            uniformly up to this many seconds (:mod:`diloco_gym.sim.rounds`).
        compute_speed: per-site timing only: the site's relative training speed, its
            weight in the token-weighted merge (default 1: every site alike).
        link_trace: a CSV file of the site's link rate over time (``time_s,share``;
            :mod:`diloco_gym.sim.fleet_links`), instead of the fleet's ``link_levels``.
    """

    name: str = "site"
    regime: str | None = "bursty"
    trace: str | None = None
    start_s: float | None = None
    target_rate_rps: float | None = None
    target_utilization: float | None = None
    sidecar: tuple[tuple[str, float], ...] = ()
    link_gbps: float = 10.0
    latency_ms: float = 50.0
    calibration: str | None = None
    delay_max_s: float = 0.0
    compute_speed: float = 1.0
    link_trace: str | None = None

    def __post_init__(self) -> None:
        self._check_name_and_ranges()
        if (self.regime is None) == (self.trace is None):
            raise FleetConfigError(f"site {self.name!r}: give exactly one of 'regime' and 'trace'")
        if not (math.isfinite(self.link_gbps) and self.link_gbps > 0):
            raise FleetConfigError(
                f"site {self.name!r}: link_gbps must be a finite number > 0, got {self.link_gbps!r}"
            )
        if not (math.isfinite(self.latency_ms) and self.latency_ms >= 0):
            raise FleetConfigError(
                f"site {self.name!r}: latency_ms must be a finite number >= 0, "
                f"got {self.latency_ms!r}"
            )
        if self.target_rate_rps is not None and not self.target_rate_rps > 0:
            raise FleetConfigError(
                f"site {self.name!r}: target_rate_rps must be > 0, got {self.target_rate_rps!r}"
            )
        if self.target_utilization is not None and not self.target_utilization > 0:
            raise FleetConfigError(
                f"site {self.name!r}: target_utilization must be > 0, "
                f"got {self.target_utilization!r}"
            )
        if self.target_rate_rps is not None and self.target_utilization is not None:
            raise FleetConfigError(
                f"site {self.name!r}: give target_rate_rps or target_utilization, not both"
            )
        if self.trace is None and (
            self.start_s is not None
            or self.target_rate_rps is not None
            or self.target_utilization is not None
        ):
            raise FleetConfigError(
                f"site {self.name!r}: start_s, target_rate_rps and target_utilization "
                f"apply to a trace site only"
            )
        if self.start_s is not None and not self.start_s >= 0:
            raise FleetConfigError(f"site {self.name!r}: start_s must be >= 0")
        valid = {f.name for f in fields(SidecarParams)}
        for key, _ in self.sidecar:
            if key not in valid:
                raise FleetConfigError(
                    f"site {self.name!r}: unknown sidecar key {key!r}; valid: {sorted(valid)}"
                )
        try:  # each override's own range, before any regime's sidecar is chosen
            replace(SidecarParams(), **dict(self.sidecar))
        except ValueError as exc:
            raise FleetConfigError(f"site {self.name!r}: sidecar: {exc}") from None

    def _check_name_and_ranges(self) -> None:
        """The name (printable, at most :data:`MAX_NAME` characters) and the numbers'
        :data:`SITE_RANGES`."""
        if not isinstance(self.name, str) or not self.name:
            raise FleetConfigError(f"site name must be a non-empty string, got {self.name!r:.60}")
        if len(self.name) > MAX_NAME or not self.name.isprintable():
            # names go into report.md, tables and feature names: a newline would forge lines
            raise FleetConfigError(
                f"site name {self.name[:60]!r} must be at most {MAX_NAME} printable "
                f"characters (no newline or other control character)"
            )
        for key, (lo, hi) in SITE_RANGES.items():
            v = getattr(self, key)
            if v is not None and not _in_range(v, lo, hi):
                raise FleetConfigError(
                    f"site {self.name!r}: {key} must be a finite number in [{lo:g}, {hi:g}], "
                    f"got {short_repr(v)}"
                )

    def sidecar_params(self, default: SidecarParams) -> SidecarParams:
        """``default`` (the calibration file's fitted sidecar, if any) with this site's
        overrides."""
        fitted = site_calibration(self.calibration)[0] if self.calibration else {}
        try:
            return replace(default, **{**fitted, **dict(self.sidecar)})
        except ValueError as exc:
            raise FleetConfigError(f"site {self.name!r}: {exc}") from None

    def interference(self, fleet: FleetParams) -> tuple[float, float]:
        """``(host_share, share_exponent)`` of this site's syncs: its calibration file's
        fitted function, else the fleet's."""
        if self.calibration:
            _, host_share, exponent = site_calibration(self.calibration)
            if host_share is not None and exponent is not None:
                return host_share, exponent
        return fleet.host_share, fleet.share_exponent


#: The longest site name (names label tables, report lines and observation features).
MAX_NAME = 100
#: Upper bounds of a site's numbers (``(low, high)``, both included; the lower bounds of
#: :class:`SiteConfig` itself still apply): far beyond any real link or trace, so that a
#: value like ``latency_ms = 1e308`` is refused with the key named.
SITE_RANGES: dict[str, tuple[float, float]] = {
    "link_gbps": (0.0, 1e6),
    "latency_ms": (0.0, 1e6),
    "start_s": (0.0, 1e9),
    "target_rate_rps": (0.0, 1e6),
    "target_utilization": (0.0, 100.0),
    "delay_max_s": (0.0, 86_400.0),
    "compute_speed": (1e-6, 1e6),
}
#: Upper bounds of the fleet's numbers (``(low, high)``, both included), as above.
FLEET_RANGES: dict[str, tuple[float, float]] = {
    "model_params": (0.0, 1e15),
    "merge_seconds": (0.0, 86_400.0),
    "fixed_s": (0.0, 86_400.0),
    "overhead_s": (0.0, 86_400.0),
    "share_exponent": (0.0, 100.0),
    "quant_penalty": (0.0, 1.0),
    "grace_s": (0.0, 86_400.0),
    "traffic_correlation": (0.0, 1.0),
    "worst_site_weight": (0.0, 1e6),
    "site_cap_pp": (0.0, 100.0),
    "fragments": (1, 2**20),
    "overlap_steps": (1, 2**31 - 1),
}


def _in_range(v: Any, lo: float, hi: float) -> bool:
    """``v`` a real number (not a bool) in ``[lo, hi]`` (NaN is not; a huge integer is
    compared exactly, never converted)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi


def short_repr(v: Any) -> str:
    """``repr(v)``, cut to about 40 characters for a one-line error."""
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:24]}... ({len(text)} characters)"


def _default_sites() -> tuple[SiteConfig, ...]:
    return tuple(SiteConfig(name=f"site{i}") for i in range(4))


@dataclass(frozen=True)
class FleetParams:
    """The fleet and its syncs (defaults and sources in docs/fleet.md).

    Attributes:
        sites: the sites (default: 4 independent bursty sites, 10 Gbit/s, 50 ms).
        model_params: parameters of the model that is synchronised (default 1.1e9, the
            OpenDiLoCo 1.1B model).
        bits: payload precision, one of :data:`BITS`.
        fragments: ``F``, Streaming DiLoCo fragments, synchronised round-robin.
        merge_seconds: the full-model (32-bit, one fragment) sync window given directly
            instead of the payload-timed one (the paper's single host: 8 s). A fragment's
            window is then ``fixed_s + (merge_seconds - fixed_s) * bits / 32 / F``.
        fixed_s: host time of every sync that does not depend on its size (launch,
            barrier); default 0.5 s.
        overhead_s: host time of a full-model sync next to the collective (merging the
            outer gradient into host memory, checkpoint I/O), scaled by the fragment's share
            ``1 / F``; default 1.5 s.
        mode: ``full`` or ``streamed`` (:data:`MODES`).
        overlap_steps: ``tau``, the inner steps a streamed fragment is spread over.
        host_share: share of a sync's serving slowdown that does not depend on the link
            share (host memory, merge compute), in [0, 1].
        share_exponent: ``gamma`` of the link-share term (> 0).
        quant_penalty: learner-progress surrogate: a sync at ``b`` bits is credited
            ``1 - quant_penalty * log2(32 / b)`` of its progress.
        worst_site_weight: ``lambda`` of the worst-site term of the cost (0: plain sum).
        site_cap_pp: ``None`` (the default: no cap) or the per-site serving cap, in
            percentage points of each site's own nominal requests: a sync is masked while
            any site's settled sync-excess plus its forecast would pass the cap
            (:mod:`diloco_gym.envs.fleet_cap`, docs/fleet.md "Guardrails").
        bits_options: ``None`` (the default: every sync at ``bits``) or the precisions the
            agent chooses from at each sync (``MultiDiscrete([2, len(bits_options)])``
            actions, docs/fleet.md; with per-site timing each site's bit then the index,
            the round's precision); ``bits`` must be one of them (the precision of syncs
            forced before the agent's first action).
        model_version: the fleet model, one of :data:`MODEL_VERSIONS`: 0 (the default, so
            that existing configurations reproduce; the ``DiLoCoFleet-v0`` id) or 1 (the
            ``DiLoCoFleet-v1`` id, or ``model_version = 1`` in a fleet file): own link
            shares, streamed host part by its work, the full-mode stall of the learners,
            fragment credit by own staleness, ring latency by hops (docs/fleet.md).
        timing: ``instant`` (the default: every site joins each sync at one instant) or
            ``rounds`` (per-site timing, model v1 only: each sync is a round that every
            site joins at its own decision within the rules below;
            :mod:`diloco_gym.sim.rounds`, docs/fleet.md "Per-site timing").
        grace_s: ``rounds`` only: the grace window after a round opens, seconds.
        quorum: ``rounds`` only: how many sites must contribute before a round may close
            (``None``: every site); the others are dropped from the round.
        traffic_correlation: ``rho`` in [0, 1] (default 0: independent sites): a share
            ``rho`` of each synthetic site's requests comes from a trace common to the
            fleet's sites of its regime, and of each trace site's from the window the
            reference trace site replays (:mod:`diloco_gym.sim.fleet_traffic`).
        traffic_common: the reference trace site's name (``None``: the first trace site),
            whose window is the trace sites' common component; only with trace sites and
            ``traffic_correlation > 0``.
        link_levels / link_probs / link_dwell_s: changing links (``None``: fixed), the
            shares of ``link_gbps`` a link moves between, their probabilities (``None``:
            alike) and the mean seconds a level holds (``None``: 60 s; docs/fleet.md).
    """

    sites: tuple[SiteConfig, ...] = field(default_factory=_default_sites)
    model_params: float = 1.1e9
    bits: int = 32
    fragments: int = 1
    merge_seconds: float | None = None
    fixed_s: float = 0.5
    overhead_s: float = 1.5
    mode: str = "full"
    overlap_steps: int = 32
    host_share: float = 0.25
    share_exponent: float = 1.0
    quant_penalty: float = 0.01
    worst_site_weight: float = 0.0
    site_cap_pp: float | None = None
    bits_options: tuple[int, ...] | None = None
    model_version: int = 0
    timing: str = "instant"
    grace_s: float = 0.0
    quorum: int | None = None
    traffic_correlation: float = 0.0
    traffic_common: str | None = None
    link_levels: tuple[float, ...] | None = None
    link_probs: tuple[float, ...] | None = None
    link_dwell_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.sites, (tuple, list)) or not all(
            isinstance(s, SiteConfig) for s in self.sites
        ):
            got = short_repr(self.sites)
            raise FleetConfigError(f"sites must be a tuple of SiteConfig, got {got}")
        if not self.sites:
            raise FleetConfigError("a fleet needs at least one site")
        check_site_count(len(self.sites), "sites")
        names = [s.name for s in self.sites]
        if len(set(names)) != len(names):
            raise FleetConfigError(f"site names must be unique, got {names}")
        if self.bits not in BITS:
            raise FleetConfigError(f"bits must be one of {BITS}, got {self.bits!r}")
        if self.mode not in MODES:
            raise FleetConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        mv = self.model_version
        if not isinstance(mv, int) or isinstance(mv, bool) or mv not in MODEL_VERSIONS:
            got = short_repr(self.model_version)
            raise FleetConfigError(f"model_version must be one of {MODEL_VERSIONS}, got {got}")
        _int_at_least("fragments", self.fragments, 1)
        _int_at_least("overlap_steps", self.overlap_steps, 1)
        _positive("model_params", self.model_params)
        _nonneg("overhead_s", self.overhead_s)
        _nonneg("fixed_s", self.fixed_s)
        _nonneg("quant_penalty", self.quant_penalty)
        _nonneg("worst_site_weight", self.worst_site_weight)
        if self.site_cap_pp is not None:
            _positive("site_cap_pp", self.site_cap_pp)
        _positive("share_exponent", self.share_exponent)
        if not 0.0 <= self.host_share <= 1.0:
            raise FleetConfigError(f"host_share must be in [0, 1], got {self.host_share!r}")
        for key, (lo, hi) in FLEET_RANGES.items():
            v = getattr(self, key)
            if v is not None and not _in_range(v, lo, hi):
                raise FleetConfigError(
                    f"{key} must be a finite number in [{lo:g}, {hi:g}], got {short_repr(v)}"
                )
        if self.merge_seconds is not None:
            _positive("merge_seconds", self.merge_seconds)
            if self.merge_seconds < self.fixed_s:
                raise FleetConfigError(
                    f"merge_seconds ({self.merge_seconds}) must be >= fixed_s ({self.fixed_s})"
                )
        self._tuples()
        _check_bits_options(self.bits_options, self.bits)
        if (err := check_fleet_links(self)) is not None:
            raise FleetConfigError(err)
        self._check_timing()
        self._check_traffic()
        if self.quant_penalty * math.log2(32 / 4) >= 1.0:
            raise FleetConfigError(
                f"quant_penalty ({self.quant_penalty}) would credit no progress at 4 bits; "
                f"it must be < {1 / math.log2(8):.4f}"
            )

    def _tuples(self) -> None:
        """The list keys given as keyword or TOML lists, stored as tuples."""
        for key in ("bits_options", "link_levels", "link_probs"):
            if isinstance(getattr(self, key), list):
                object.__setattr__(self, key, tuple(getattr(self, key)))

    @property
    def n_sites(self) -> int:
        return len(self.sites)

    @property
    def per_site_timing(self) -> bool:
        return self.timing == "rounds"

    def _check_traffic(self) -> None:
        """``traffic_common`` names a trace site, and only where a trace site's traffic is
        mixed (never silently unused)."""
        tc = self.traffic_common
        if tc is None:
            return
        if not isinstance(tc, str):
            raise FleetConfigError(f"traffic_common must be a site name, got {short_repr(tc)}")
        traced = [s.name for s in self.sites if s.trace is not None]
        if tc not in traced:
            raise FleetConfigError(
                f"traffic_common must name a trace site, one of {traced}, got {short_repr(tc)}"
            )
        if not self.traffic_correlation > 0:
            raise FleetConfigError("traffic_common applies only with traffic_correlation > 0")

    def _check_timing(self) -> None:
        """``timing`` and the keys that only per-site timing reads (never silently unused)."""
        if self.timing not in TIMINGS:
            got = short_repr(self.timing)
            raise FleetConfigError(f"timing must be one of {TIMINGS}, got {got}")
        site_keys = [
            (s.name, k)
            for s in self.sites
            for k, default in (("delay_max_s", 0.0), ("compute_speed", 1.0))
            if getattr(s, k) != default
        ]
        if self.timing == "instant":
            used = [k for k in ("grace_s", "quorum") if getattr(self, k) not in (0.0, None)]
            used += [f"site {n!r} {k}" for n, k in site_keys]
            if used:
                raise FleetConfigError(
                    f"{', '.join(used)} apply to per-site timing only; set timing = 'rounds'"
                )
            return
        if self.model_version < 1:
            raise FleetConfigError("timing = 'rounds' needs the fleet model v1 (model_version = 1)")
        q = self.quorum
        if q is not None and (
            not isinstance(q, int) or isinstance(q, bool) or not 1 <= q <= self.n_sites
        ):
            raise FleetConfigError(
                f"quorum must be an integer in [1, {self.n_sites}] (the number of sites) or "
                f"absent (every site), got {short_repr(q)}"
            )


def _check_bits_options(options: Any, bits: int) -> None:
    if options is None:
        return
    if not isinstance(options, tuple) or not options:
        raise FleetConfigError(
            f"bits_options must be None or a non-empty list of precisions, got {options!r}"
        )
    for b in options:
        if b not in BITS or isinstance(b, bool):
            raise FleetConfigError(f"bits_options: each must be one of {BITS}, got {b!r}")
    if len(set(options)) != len(options):
        raise FleetConfigError(f"bits_options must not repeat a precision, got {options!r}")
    if bits not in options:
        raise FleetConfigError(f"bits ({bits}) must be one of bits_options {options!r}")


def _int_at_least(name: str, v: Any, lo: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise FleetConfigError(f"{name} must be an integer >= {lo}, got {v!r}")


def _positive(name: str, v: Any) -> None:
    if not _in_range(v, 0.0, math.inf) or v == 0 or v == math.inf:
        raise FleetConfigError(f"{name} must be a finite number > 0, got {short_repr(v)}")


def _nonneg(name: str, v: Any) -> None:
    if not _in_range(v, 0.0, math.inf) or v == math.inf:
        raise FleetConfigError(f"{name} must be a finite number >= 0, got {short_repr(v)}")


def payload_bytes(model_params: float, bits: int, fragments: int = 1) -> float:
    """Bytes all-reduced by one sync: ``model_params * bits / 8 / fragments``."""
    return model_params * bits / 8.0 / fragments


def ring_allreduce_seconds(payload: float, n: int, slowest_gbps: float, latency_s: float) -> float:
    """Ring all-reduce time of ``payload`` bytes over ``n`` participants (alpha-beta model,
    Thakur et al. 2005): ``2 (n-1)/n * payload * 8 / (slowest_gbps * 1e9) + 2 (n-1) *
    latency_s``; 0 for one participant (nothing crosses a link)."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * payload * 8.0 / (slowest_gbps * 1e9) + 2.0 * (n - 1) * latency_s


def ring_latency_seconds(latencies_ms: list[float] | tuple[float, ...], version: int = 1) -> float:
    """The latency of one step of a ring all-reduce over sites of these access latencies
    (ms, in the ring's order: the fleet's sites in their configured order), seconds.

    Model v1: a hop from site ``i`` to site ``j`` costs ``latency_i + latency_j`` (each
    latency is the site's access to the network). In each of the ring's ``2 (N - 1)``
    steps every site sends to its neighbour at once, so a step lasts as long as its
    slowest hop: the largest ``latency_i + latency_(i+1 mod N)`` around the ring (not the
    sum of the hops, which are concurrent). Model v0: the largest site latency. 0 for one
    site (nothing crosses a link).
    """
    lat = [float(x) / 1000.0 for x in latencies_ms]
    n = len(lat)
    if n <= 1:
        return 0.0
    if version == 0:
        return max(lat)
    return max(lat[i] + lat[(i + 1) % n] for i in range(n))


def fragment_corridor(h_min: int, h_max: int, fragments: int) -> tuple[int, int]:
    """The corridor on consecutive fragment syncs, in decisions:
    ``[ceil(h_min / F), floor(h_max / F)]``.

    Round-robin over ``F`` fragments makes a fragment's own gap the sum of ``F``
    consecutive gaps, so it lies in ``[F * ceil(h_min/F), F * floor(h_max/F)]``, inside
    ``[h_min, h_max]``: no fragment syncs too early, none starves.

    Raises:
        FleetConfigError: the rounded corridor is empty.
    """
    lo = -(-h_min // fragments)
    hi = h_max // fragments
    if lo < 1 or hi < lo:
        raise FleetConfigError(
            f"fragments={fragments}: the corridor [{h_min}, {h_max}] decisions leaves "
            f"consecutive fragment syncs the empty gap range [{lo}, {hi}]"
        )
    return lo, hi


@dataclass(frozen=True)
class SyncPlan:
    """What one fragment sync is: its window (s), the link share it uses (the ring's, over
    the slowest link), the collective time, the payload (bytes) and each site's serving
    slowdown during the window; ``stall_s``: the seconds the learners wait for the sync
    (model v1; 0 in v0); ``site_shares``: each site's own link share (model v1: the
    ring's share times the slowest link's rate over the site's; v0: the ring's share at
    every site)."""

    window_s: float
    link_share: float
    collective_s: float
    payload_bytes: float
    slowdowns: tuple[float, ...]
    stall_s: float = 0.0
    site_shares: tuple[float, ...] = ()


def sync_slowdown(base: float, share: float, host_share: float, exponent: float) -> float:
    """Serving slowdown of a sync that uses ``share`` of the link (in (0, 1]):
    ``base * (host_share + (1 - host_share) * share ** exponent)``; exactly ``base`` at
    full share."""
    if share >= 1.0:
        return base
    return base * (host_share + (1.0 - host_share) * share**exponent)


def streamed_slowdown(
    base: float,
    share: float,
    ratio: float,
    host_s: float,
    window_s: float,
    host_share: float,
    exponent: float,
) -> float:
    """Model v1's serving slowdown of a site during a sync window (one value for the
    window, as the sidecar takes it): the time-average that gives the window's
    slowdown-seconds exactly.

    ``share`` is the ring's link share over the collective's part of the window
    (``window_s - host_s``), ``ratio`` the slowest link's rate over this site's (the site's
    own share is ``ratio * share``). The slowdown-seconds are

        sync_slowdown(base, ratio) * host_s                       (the host's own work)
        + base * host_share * collective_s                        (the host's part of the
                                                                   collective, by its work)
        + base * (1 - host_share) * (ratio * share) ** exponent * (window_s - host_s)
                                                                  (the link's part, over
                                                                   the collective's time)

    with ``collective_s = share * (window_s - host_s)``, the collective's time at the full
    rate. The host parts are charged for the work done, which stretching the collective
    does not change; at ``exponent = 1`` the slowdown-seconds are those of sending the
    fragment at the full rate, whatever the stretch. At ``share >= 1`` (the full rate) the
    value is :func:`sync_slowdown` of the site's own share, ``ratio``, exactly (full mode).
    """
    full = sync_slowdown(base, ratio, host_share, exponent)
    if share >= 1.0:
        return full
    link_s = window_s - host_s
    coll = share * link_s
    seconds = (
        full * host_s
        + base * host_share * coll
        + base * (1.0 - host_share) * (ratio * share) ** exponent * link_s
    )
    return seconds / window_s


def sync_plan(fleet: FleetParams, sidecars: list[SidecarParams], step_seconds: float) -> SyncPlan:
    """The fragment sync of ``fleet``: its window, link share, per-site slowdown and (model
    v1) the learners' stall.

    Full mode: the window is ``fixed_s + overhead_s / F + T`` where ``T`` is the ring
    all-reduce time of one fragment's payload (:func:`ring_allreduce_seconds` over the
    sites, slowest link, the step latency of :func:`ring_latency_seconds`), or with
    ``merge_seconds`` given ``fixed_s + (merge_seconds - fixed_s) * bits / 32 / F`` (exactly
    ``merge_seconds`` at 32 bits and F = 1); link share 1. Streamed mode: the collective is
    spread over ``overlap_steps`` inner steps, window ``max(full window, overlap_steps *
    step_seconds)``, link share ``T / (window - host time)``.

    Model v0: each site's slowdown is :func:`sync_slowdown` of its sidecar's
    ``sync_slowdown`` at the ring's share, with the site's interference function
    (:meth:`SiteConfig.interference`).

    Model v1: each site's own link share is the ring's share times ``slowest link / its
    link`` (the ring runs at the slowest link's rate); its slowdown is
    :func:`streamed_slowdown` (full mode: :func:`sync_slowdown` at its own share). With
    more than one site, the learners stall for the window in full mode (a non-overlapped
    outer sync blocks them), and in streamed mode for the part of the full-rate window the
    overlap of ``overlap_steps`` inner steps does not cover (0 when it covers it). One site
    has no collective between sites and never stalls (it is the single env's merge).
    """
    f = fleet
    v1 = f.model_version >= 1
    payload = payload_bytes(f.model_params, f.bits, f.fragments)
    slowest = min(s.link_gbps for s in f.sites)
    if f.merge_seconds is not None:
        if f.bits == 32 and f.fragments == 1:
            full = float(f.merge_seconds)
        else:
            full = f.fixed_s + (f.merge_seconds - f.fixed_s) * f.bits / 32.0 / f.fragments
        host = f.fixed_s
        coll = full - host
    else:
        lat = ring_latency_seconds([s.latency_ms for s in f.sites], f.model_version)
        coll = ring_allreduce_seconds(payload, f.n_sites, slowest, lat)
        host = f.fixed_s + f.overhead_s / f.fragments
        full = host + coll
    if f.mode == "full" or coll <= 0.0:
        window, share = full, 1.0
    else:
        window = max(full, f.overlap_steps * step_seconds)
        share = min(1.0, coll / max(window - host, 1e-12))
    if window <= 0:
        raise FleetConfigError(
            "the sync window is 0 s (one site, no host time): give merge_seconds or fixed_s > 0"
        )
    if not v1:
        slow = tuple(
            sync_slowdown(sc.sync_slowdown, share, *site.interference(f))
            for site, sc in zip(f.sites, sidecars, strict=True)
        )
        return SyncPlan(window, share, coll, payload, slow, 0.0, (share,) * f.n_sites)
    ratios = [slowest / s.link_gbps if f.n_sites > 1 else 1.0 for s in f.sites]
    slow = tuple(
        streamed_slowdown(sc.sync_slowdown, share, r, host, window, *site.interference(f))
        for site, sc, r in zip(f.sites, sidecars, ratios, strict=True)
    )
    if f.n_sites == 1:
        stall = 0.0
    elif f.mode == "full":
        stall = window
    else:
        stall = max(0.0, full - f.overlap_steps * step_seconds)
    return SyncPlan(
        window, share, coll, payload, slow, stall, tuple(min(1.0, share * r) for r in ratios)
    )


def fragment_work_seconds(
    gap_s: float, own_s: float, drift_s: float, merge_overhead_s: float = 0.0
) -> float:
    """Model v1's learner work credited by a fragment sync, in seconds of the learners'
    summed throughput: ``efficiency(own_s) * gap_s``, with the learner model's drift
    efficiency ``1 / (1 + s / drift_s [+ merge_overhead_s / s])``
    (:func:`~diloco_gym.sim.learners.merge_gain`).

    ``gap_s``: the learners' compute seconds since the previous fragment sync (of any
    fragment): the work this sync adds, one fragment's share of the work since this
    fragment's own last sync. ``own_s``: the compute seconds since this fragment's own
    last sync (its staleness), over which its local models drifted. Compute seconds
    exclude the seconds the learners stalled (:attr:`SyncPlan.stall_s`). Model v0 credits
    ``efficiency(gap) * gap`` with the wall-clock gap since the previous fragment sync.
    0 when either is not positive (nothing was trained)."""
    if gap_s <= 0.0 or own_s <= 0.0:
        return 0.0
    if merge_overhead_s != 0.0:
        eff = 1.0 / (1.0 + own_s / drift_s + merge_overhead_s / own_s)
    else:
        eff = 1.0 / (1.0 + own_s / drift_s)
    return eff * gap_s


def check_site_count(count: int, what: str) -> None:
    """A fleet's sites must be within ``DILOCO_GYM_MAX_FLEET_SITES`` (each site holds its
    own episode, about 2 MB): checked before any site is built."""
    try:
        check_limit("FLEET_SITES", count, what)
    except LimitError as exc:
        raise FleetConfigError(str(exc)) from None


def progress_factor(bits: int, quant_penalty: float) -> float:
    """Share of a sync's learner progress credited at ``bits`` (surrogate, tunable):
    ``1 - quant_penalty * log2(32 / bits)``; exactly 1 at 32 bits."""
    if bits == 32:
        return 1.0
    return 1.0 - quant_penalty * math.log2(32 / bits)


@functools.lru_cache(maxsize=64)
def site_calibration(path: str) -> tuple[dict[str, float], float | None, float | None]:
    """What a fleet site takes from a live calibration file: ``(fitted_sidecar,
    host_share, share_exponent)``; the last two are ``None`` when the file has no
    ``interference`` block (a run at the full link share only).

    The file is checked against the calibration schema
    (``diloco_gym/data/calibration.schema.json``, with ``jsonschema``).

    Raises:
        FleetConfigError: one line naming the file: unreadable, not JSON, against the
            schema, or an interference function the run could not determine.
    """
    import json
    from importlib import resources

    import jsonschema

    from diloco_gym.sim import parsing

    try:
        text = parsing.read_text(
            path,
            limit_name="CALIBRATION_BYTES",
            encoding="utf-8-sig",
            what="calibration file size in bytes",
        )
        doc = parsing.parse_json(text, str(path))
    except LimitError as exc:
        raise FleetConfigError(str(exc)) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FleetConfigError(f"{path}: cannot read the calibration file ({exc})") from None
    schema = json.loads(
        resources.files("diloco_gym").joinpath("data/calibration.schema.json").read_text()
    )
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schema).iter_errors(doc)
    )
    if error is not None:
        field_ = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        raise FleetConfigError(f"{path}: field {field_}: {error.message}")
    bad = _non_finite(doc, "")
    if bad is not None:  # JSON has no NaN; Python's reader and the schema's ranges let it in
        raise FleetConfigError(f"{path}: field {bad}: not a finite number")
    fitted = {k: float(v) for k, v in (doc.get("fitted_sidecar") or {}).items()}
    block = doc.get("interference")
    if block is None:
        return fitted, None, None
    h, gamma = block.get("host_share"), block.get("share_exponent")
    if h is None or gamma is None:
        why = "; ".join(block.get("notes") or []) or block.get("error", "no value")
        raise FleetConfigError(
            f"{path}: the interference function is undetermined ({why}); measure at link "
            f"shares where merges slow serving, or drop the file's interference block"
        )
    return fitted, float(h), float(gamma)


def _non_finite(value: Any, field: str) -> str | None:
    """The dotted field of the first non-finite number of a parsed JSON document."""
    if isinstance(value, float) and not math.isfinite(value):
        return field or "(top level)"
    if isinstance(value, (dict, list)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            bad = _non_finite(item, f"{field}.{key}" if field else str(key))
            if bad is not None:
                return bad
    return None
