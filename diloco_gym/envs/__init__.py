"""The environments: episode construction and state (:mod:`~diloco_gym.envs.core`), the
single Gymnasium env (:mod:`~diloco_gym.envs.env`), the native vector env
(:mod:`~diloco_gym.envs.vector`), rendering (:mod:`~diloco_gym.envs.render`) and the
budget state and features that budget-aware agents and learned policies read
(:mod:`~diloco_gym.envs.budget_features`).
"""
