"""The environments: episode construction and state (:mod:`~diloco_gym.envs.core`), the
single Gymnasium env (:mod:`~diloco_gym.envs.env`), the native vector env
(:mod:`~diloco_gym.envs.vector`) and rendering (:mod:`~diloco_gym.envs.render`).
"""
