"""The command line's parts: one module per command that has moved out of
:mod:`diloco_gym.cli` (:mod:`~diloco_gym.commands.sweep`, :mod:`~diloco_gym.commands.tune`;
each with ``HELP``, ``add_arguments(parser)`` and ``run(args)``, registered in
``cli.COMMANDS``), :mod:`~diloco_gym.commands.options` for the options several commands share,
:mod:`~diloco_gym.commands.checks` for the option checks made before any work and
:mod:`~diloco_gym.commands.extras` for the message of a missing optional extra."""
