"""``python tests/run_until_killed.py STEP ARGS...``: ``scalelong ARGS...`` that waits to be killed
after step STEP (its log record, checkpoint and sample grid). The kill-and-resume tests start it."""

import functools
import sys
import time

import scalelong.train
from scalelong.cli import main


def wait_after(at_step: int):
    """A step hook that sleeps for good once step ``at_step`` is done."""

    def hook(step: int, trainer) -> None:
        while step == at_step:
            time.sleep(0.5)

    return hook


if __name__ == "__main__":
    at_step, argv = int(sys.argv[1]), sys.argv[2:]
    train = functools.partial(scalelong.train.train, step_hooks=[wait_after(at_step)])
    scalelong.train.train = train  # what `scalelong train` calls
    sys.exit(main(argv))
