"""``python -m scalelong.cli`` (and ``accelerate launch -m scalelong.cli``): the ``scalelong`` command."""

from scalelong.cli import run

run()
