"""What a :class:`~diloco_gym.envs.env.DiLoCoSyncEnv` step's ``info`` holds, key by key,
and whether each key is causal (computable from the past alone)."""

from __future__ import annotations

__all__ = ["INFO_KEYS"]

#: Every key of a ``DiLoCoSyncEnv`` step's (and reset's) ``info``: ``(causal, meaning)``.
#: ``causal`` is ``"yes"`` when the value is computable from the past alone (requests that
#: arrived before the decision it comes with), else it names what it looks ahead at. The test
#: suite checks that every info has exactly these keys and that the ``"yes"`` ones agree on
#: two traces equal up to a cut, in both reward modes.
INFO_KEYS: dict[str, tuple[str, str]] = {
    "episode_seed": ("yes", "the episode's seed (reset only)"),
    "decision": ("yes", "the index of the current decision"),
    "time_s": ("yes", "the current decision's time in the episode"),
    "gap_steps": ("yes", "training steps since the last merge"),
    "merged": ("yes", "whether this step launched a merge"),
    "action_overridden": ("yes", "whether the chosen action was infeasible and replaced"),
    "merges": ("yes", "merges launched so far"),
    "action_mask": ("yes", "feasible actions now, int8 [defer, merge]"),
    "excess_requests_so_far": (
        "additive mode: no, each launched merge's own cost window (merge_seconds + tail_s "
        "after launch), the additive reward's look-ahead; exact mode: yes",
        "requests the sync_excess reward terms have counted so far",
    ),
    "reward_terms": (
        "as the reward: additive mode looks ahead over each merge's own cost window; exact "
        "mode is causal except on the episode's last step",
        "the reward's terms, {'sync_excess', 'progress'}",
    ),
    "episode_summary": (
        "no: the last step only, the whole episode's exact replay",
        "the exact replay of the episode's schedule (last step only)",
    ),
}
