"""Evaluation: running agents (:mod:`~diloco_gym.eval.rollout`), exact scoring
(:mod:`~diloco_gym.eval.scorer`), the offline oracle (:mod:`~diloco_gym.eval.oracle`), the
matched-random control and the statistics (:mod:`~diloco_gym.eval.protocol`), the protocol's units
(:mod:`~diloco_gym.eval.units`) and cells (:mod:`~diloco_gym.eval.cells`), the report
(:mod:`~diloco_gym.eval.report`, its documents :mod:`~diloco_gym.eval.report_render` and
figures :mod:`~diloco_gym.eval.report_figures`) and the frontier leaderboard (single host and
fleet), the options they share (:mod:`~diloco_gym.eval.replay_options`), output
directories (:mod:`~diloco_gym.eval.output_dir`: the rules of every command that writes
one), and calibration files
(:mod:`~diloco_gym.eval.calibration`).
"""
