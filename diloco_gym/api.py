"""The calibration protocol from Python: :func:`evaluate` judges one scheduler against
matched random and returns the verdict table ``diloco-gym report`` writes.

It builds the report's :class:`~diloco_gym.eval.report.ReportConfig` and runs
:func:`~diloco_gym.eval.report.run_protocol`, the command's own code path: the same
episodes, the same exact replay, the same statistics and verdicts, and the deployable
agents sealed in a worker process unless ``in_process=True``.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["evaluate", "Evaluation"]


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` returns.

    Attributes:
        agent: the judged agent's name (its rows' ``agent`` column).
        result: :func:`~diloco_gym.eval.report.run_protocol`'s result (every agent of the
            run: ``rows``, ``summary``, ``calibration``, ``config``, ...).
    """

    agent: str
    result: dict[str, Any]

    def to_frame(self) -> pd.DataFrame:
        """The agent's verdict table: the report's summary rows of this agent (one per
        regime; report.json's ``summary``): its sync-excess against matched random at the
        same merges, the difference and its CI, the p-value (raw and Holm-adjusted), the
        oracle, and the verdict."""
        summary = self.result["summary"]
        return summary[summary["agent"] == self.agent].reset_index(drop=True)

    @property
    def episodes(self) -> pd.DataFrame:
        """The agent's episodes as results.csv gives them (one row per regime and unit)."""
        rows = self.result["rows"]
        return rows[rows["agent"] == self.agent].reset_index(drop=True)

    @property
    def verdicts(self) -> dict[str, str]:
        """The verdict per regime."""
        frame = self.to_frame()
        return dict(zip(frame["regime"], frame["verdict"], strict=True))

    def write(self, out: str | Path, force: bool = False) -> Path:
        """Write the report directory ``diloco-gym report`` would (report.md,
        results.csv, report.json, figures) for every agent of the run."""
        from diloco_gym.eval.report import write_report

        return write_report(self.result, out, force=force, command="diloco_gym.evaluate(...)")

    def __str__(self) -> str:
        from diloco_gym.eval.report_render import console_summary

        summary = self.result["summary"]
        return console_summary(summary[summary["agent"] == self.agent])


def _check_not_bootstrapping() -> None:
    """Refuse to start an evaluation from a spawned process-pool worker that is importing
    the calling script (``backend="processes"`` and no ``if __name__ == "__main__":``
    guard): the worker would run the evaluation again instead of its cells. Sealed agents'
    own workers never import the calling script."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(
            "diloco_gym.evaluate() was called while a worker process imported the calling "
            "script: a process pool's workers import it, so put the call "
            "under `if __name__ == '__main__':`"
        )


def evaluate(
    agent: Any,
    regimes: Sequence[str] | None = None,
    seeds: int = 20,
    seed0: int = 0,
    draws: int = 1000,
    *,
    alongside: Sequence[str] = (),
    in_process: bool = False,
    progress: bool = False,
    backend: str = "serial",
    jobs: int | None = None,
    **options: Any,
) -> Evaluation:
    """Judge ``agent`` against matched random by the protocol of ``diloco-gym report``.

    ``evaluate(agent, regimes=["bursty"], seeds=20)`` gives the table that
    ``diloco-gym report --agents AGENT --regimes bursty --seeds 20`` writes (the same
    numbers: it runs the same code).

    Args:
        agent: an agent argument of the command line (a registry name, a model ``.zip``,
            ``"module:attr"``, ``"path/to/file.py:attr"``), or an object with
            Stable-Baselines3's ``predict`` (an instance, a class, a factory, a function
            ``f(observation) -> action``, a loaded SB3 model;
            :func:`diloco_gym.agents.user.as_agent`). An object runs in this process's
            cells (``backend="serial"``); it is still sealed, each deployable agent in a
            worker process that receives it pickled.
        regimes: the regimes (default: every regime).
        seeds: episodes per regime (at least 2; 6 or more can reach a verdict).
        seed0: the first episode seed.
        draws: matched-random draws per episode.
        alongside: other agents (arguments as for the command line) run in the same report:
            they share the regime's Holm family, as in ``report --agents``.
        in_process: run deployable agents in this process (``--in-process-agents``).
        progress: show a progress bar.
        backend, jobs: where the cells run (``serial``, ``processes``, ``ray``).
        **options: further :class:`~diloco_gym.eval.report.ReportConfig` fields
            (``calibration``, ``trace``, ``window_s``, ``rate_scale``, ``alpha``, ...).

    Returns:
        An :class:`Evaluation`; ``.to_frame()`` is the verdict table.

    Raises:
        ValueError: a bad option, an unknown agent, or code that cannot be made an agent
            (:class:`~diloco_gym.agents.user.AgentSpecError`).
        RuntimeError: called from a script without an ``if __name__ == "__main__":``
            guard while a process pool's worker imports it.
    """
    _check_not_bootstrapping()
    from diloco_gym.agents.user import unregister_object
    from diloco_gym.eval.report import ReportConfig, run_protocol
    from diloco_gym.sim.regimes import REGIMES

    spec, registered = _agent_spec(agent, backend)
    try:
        config = ReportConfig(
            regimes=list(regimes) if regimes is not None else list(REGIMES),
            agents=[spec, *alongside],
            seeds=seeds,
            seed0=seed0,
            draws=draws,
            in_process_agents=in_process,
            **options,
        )
        config.require_choice()
        name = _free_agent_name(spec)
        _refuse_budget_aware(alongside)
        result = run_protocol(config, progress=progress, backend=backend, jobs=jobs)
    finally:
        if registered:
            unregister_object(spec)
    return Evaluation(agent=name, result=result)


def _agent_spec(agent: Any, backend: str) -> tuple[str, bool]:
    """The agent argument the report's configuration names ``agent`` by, and whether it is
    an object registered in this process for the run (:func:`register_object`)."""
    from diloco_gym.agents.user import as_agent, register_object

    if isinstance(agent, str):
        return agent, False
    if backend != "serial":
        raise ValueError(
            f"an agent object runs with backend='serial' (cells in other processes "
            f"cannot reach it; got backend={backend!r}): give it as 'module:attr' or "
            f"'path/to/file.py:attr' to use other backends"
        )
    return register_object(as_agent(agent)), True


def _free_agent_name(spec: str) -> str:
    """The name of the agent ``spec`` builds; a budget-aware agent is refused (a report
    gives no merge budget)."""
    from diloco_gym.agents.registry import is_budget_aware, make_agents

    made = make_agents([spec])[0]
    if is_budget_aware(made):
        raise ValueError(
            f"{made.name} steers by a merge budget and runs only with one; compare it "
            f"at every budget of a grid with `diloco-gym frontier --budget-agents`"
        )
    return made.name


def _refuse_budget_aware(specs: Sequence[str]) -> None:
    """Agents that need a merge budget cannot run in a report (``alongside``)."""
    from diloco_gym.agents.registry import is_budget_aware_spec

    needs = [a for a in specs if is_budget_aware_spec(a)]
    if needs:
        raise ValueError(
            f"{', '.join(needs)} steer(s) by a merge budget and run(s) only with one; compare "
            f"them at every budget of a grid with `diloco-gym frontier --budget-agents`"
        )
