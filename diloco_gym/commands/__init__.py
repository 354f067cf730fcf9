"""The command line's parts: :mod:`~diloco_gym.commands.options` holds the options several
commands share (the commands themselves are in :mod:`diloco_gym.cli`)."""
