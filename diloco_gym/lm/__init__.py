"""A real, small DiLoCo trainer and the learner calibration it produces.

* :mod:`diloco_gym.lm.data`: the byte-level corpus (the Python standard library's own
  source files, with a fixed held-out split) and the learners' shards.
* :mod:`diloco_gym.lm.trainer`: a tiny decoder language model and the DiLoCo loop (K
  learners, H inner AdamW steps, an outer Nesterov SGD step on the averaged
  pseudo-gradient; any merge schedule, fragments, quantised pseudo-gradients). Needs torch
  (the ``rl`` extra).
* :mod:`diloco_gym.lm.fit`: the fit of the learner surrogate to measured runs (numpy and
  scipy only).
* :mod:`diloco_gym.lm.calibrate`: ``diloco-gym calibrate-learners``, the designed set of
  runs, the fit, the held-out validation and the calibration file.
* :mod:`diloco_gym.lm.anchors`: the published effects of the sync interval H on DiLoCo's
  loss (as data, with their sources), ours measured and fitted beside them, and one figure
  of all (numpy; matplotlib when drawing).

The ``sim`` and ``envs`` layers never import this package; the calibrated surrogate they
use lives in :mod:`diloco_gym.sim.learner_calibration`.
"""
