"""Evaluation: running agents (:mod:`~diloco_gym.eval.rollout`), exact scoring, the
matched-random control and the statistics (:mod:`~diloco_gym.eval.protocol`), the report
and the frontier leaderboard, and calibration files (:mod:`~diloco_gym.eval.calibration`).
"""
