"""The ``kernelarc`` commands, one module per group. Each module has ``add_parsers(sub)``,
which adds its subcommands (``fn`` is the function that runs one); ``GROUPS`` is the order
in which ``kernelarc --help`` lists them."""

from __future__ import annotations

from . import demo, export, judge, memory, model, problems, serve, swarm

GROUPS = (problems, judge, export, serve, memory, swarm, demo, model)
