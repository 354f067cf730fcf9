"""Evaluation: running agents (:mod:`~diloco_gym.eval.rollout`), exact scoring
(:mod:`~diloco_gym.eval.scorer`), the offline oracle (:mod:`~diloco_gym.eval.oracle`), the
matched-random control and the statistics (:mod:`~diloco_gym.eval.protocol`), the protocol's units
(:mod:`~diloco_gym.eval.units`) and cells (:mod:`~diloco_gym.eval.cells`), the report and the
frontier leaderboard (single host and fleet), and calibration files
(:mod:`~diloco_gym.eval.calibration`).
"""
