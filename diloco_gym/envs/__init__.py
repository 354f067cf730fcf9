"""The environments, one concept per module: the parameters
(:mod:`~diloco_gym.envs.params`), the observation table (:mod:`~diloco_gym.envs.observation`),
episodes (:mod:`~diloco_gym.envs.episode`), the kernel: draws, state and rules
(:mod:`~diloco_gym.envs.kernel`), a schedule's replay and summary
(:mod:`~diloco_gym.envs.schedule`), the reward scale (:mod:`~diloco_gym.envs.reward`), the
single Gymnasium env (:mod:`~diloco_gym.envs.env`), the native vector env
(:mod:`~diloco_gym.envs.vector`) and its episode pool (:mod:`~diloco_gym.envs.bank`), the
fleet env (:mod:`~diloco_gym.envs.fleet`), rendering (:mod:`~diloco_gym.envs.render`) and the
budget state and features that budget-aware agents and learned policies read
(:mod:`~diloco_gym.envs.budget_features`). :mod:`~diloco_gym.envs.core` re-exports the names
that lived there before 0.6.0, for one release.
"""
