"""The command line's parts: :mod:`~diloco_gym.commands.options` holds the options several
commands share, :mod:`~diloco_gym.commands.checks` the option checks before any work and
:mod:`~diloco_gym.commands.extras` the message for a missing optional extra (the commands
themselves are in :mod:`diloco_gym.cli`)."""
