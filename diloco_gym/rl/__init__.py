"""Reinforcement learning: the Stable-Baselines3 vector adapter (:mod:`~diloco_gym.rl.sb3`)
and the ``diloco-gym train`` command (:mod:`~diloco_gym.rl.train`). Importing this package
does not import Stable-Baselines3 or torch; its modules do.
"""
