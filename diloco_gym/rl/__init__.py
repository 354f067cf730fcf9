"""Reinforcement learning on the envs with Stable-Baselines3.

``diloco-gym train`` is :mod:`~diloco_gym.rl.command` (the command line) over
:mod:`~diloco_gym.rl.trainer` (a run in named steps), which uses
:mod:`~diloco_gym.rl.train_envs` (the one builder of training envs, training seeds only),
:mod:`~diloco_gym.rl.run_dir` (run directories, checkpoints, atomic writes),
:mod:`~diloco_gym.rl.validation` (held-out validation, model selection, curves),
:mod:`~diloco_gym.rl.imitation` (the behaviour-cloning warm start),
:mod:`~diloco_gym.rl.algos` (the algorithm table), :mod:`~diloco_gym.rl.config`
(config files) and :mod:`~diloco_gym.rl.env_specs` (a run's env kinds: regimes, traces or a
fleet). :mod:`~diloco_gym.rl.wrappers` gives a policy its budget features,
:mod:`~diloco_gym.rl.sb3` adapts the native vector env, :mod:`~diloco_gym.rl.seeds` trains
and judges a configuration across training seeds (:mod:`~diloco_gym.rl.aggregate`: the
aggregate measures), and
:mod:`~diloco_gym.rl.train` keeps 0.5.0's names; :mod:`~diloco_gym.rl.callbacks` logs each
episode's score against matched random (:class:`diloco_gym.wrappers.MatchedRandomScore`)
to a run's TensorBoard. Importing this
package does not import Stable-Baselines3 or torch; its modules do.
"""
