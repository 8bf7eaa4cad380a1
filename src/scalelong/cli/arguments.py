"""What the command groups' parsers share: the config with its overrides, and argument types.

Light on purpose: ``scalelong --help`` builds every parser, so nothing here imports torch.
"""

from __future__ import annotations

import argparse


def add_config_args(p: argparse.ArgumentParser) -> None:
    """The positional config (a YAML file or a preset's name) and its dotted overrides."""
    p.add_argument(
        "config", help="YAML config file or preset name, e.g. demo (`scalelong configs` lists the presets)"
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="dotted overrides such as model.skip.method=cs model.skip.kappa=0.5",
    )


def at_least(minimum: int):
    """An argparse type: an integer >= ``minimum`` (a bad value is argparse's one-line error)."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {number}")
        return number

    parse.__name__ = f"integer >= {minimum}"
    return parse


def seed(value: str) -> int:
    """An argparse type: a seed in [0, 2**31), the range of train.seed (torch refuses seeds from 2**64 on,
    with a traceback, and image i of ``sample`` is drawn from seed + i)."""
    from scalelong.training.config import SEED_LIMIT

    number = at_least(0)(value)
    if number >= SEED_LIMIT:
        raise argparse.ArgumentTypeError(
            f"must be < 2**31 = {SEED_LIMIT}, got {number}; choose a smaller seed"
        )
    return number


def checkpoint_step(value: str) -> int | str:
    """An argparse type: a checkpoint's step, or ``latest`` / ``best``."""
    if value in ("latest", "best"):
        return value
    return at_least(0)(value)
