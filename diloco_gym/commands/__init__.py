"""The command line's parts: one module per ``diloco-gym`` command
(:mod:`~diloco_gym.commands.run`, :mod:`~diloco_gym.commands.report`,
:mod:`~diloco_gym.commands.frontier`, :mod:`~diloco_gym.commands.sweep`,
:mod:`~diloco_gym.commands.tune`, :mod:`~diloco_gym.commands.train`,
:mod:`~diloco_gym.commands.calibrate`, :mod:`~diloco_gym.commands.calibrate_learners`; each
with ``HELP``, ``add_arguments(parser)`` and ``run(args)``, registered in ``cli.COMMANDS``),
:mod:`~diloco_gym.commands.options` for the options several commands share,
:mod:`~diloco_gym.commands.checks` for the option checks made before any work,
:mod:`~diloco_gym.commands.jobs` for a fleet job and the command line an output records, and
:mod:`~diloco_gym.commands.extras` for the message of a missing optional extra."""
