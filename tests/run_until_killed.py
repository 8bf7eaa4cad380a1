"""``python tests/run_until_killed.py STEP ARGS...``: ``scalelong ARGS...`` whose runs wait to be
killed after step STEP (its log record, checkpoint and sample grid). The kill-and-resume tests
start it with ``train``; with ``compare`` or ``sweep`` every run of the study waits, in this
process or in ``--jobs`` workers (the hook pickles, so it reaches them). A test in this process
can also make the runs wait until a file appears (:func:`waiting_run_all`)."""

import functools
import os
import sys
import time

# Nothing of scalelong at the top: the hooks pickle by reference to this file, so every pool worker
# and scheduler job imports it, and the CLI's modules would cost each of them seconds.


def wait_after(at_step: int, step: int, trainer) -> None:
    """A step hook that sleeps for good once step ``at_step`` is done."""
    while step == at_step:
        time.sleep(0.5)


def wait_for(path: str, at_step: int, step: int, trainer) -> None:
    """A step hook that waits once step ``at_step`` is done until the file ``path`` exists."""
    while step == at_step and not os.path.exists(path):
        time.sleep(0.2)


def waiting_run_all(run_all, at_step: int, until: str | os.PathLike | None = None):
    """``run_all`` whose runs all wait after step ``at_step``: for good (:func:`wait_after`), or
    until the file ``until`` exists (:func:`wait_for`)."""
    hook = (
        functools.partial(wait_after, at_step)
        if until is None
        else functools.partial(wait_for, os.fspath(until), at_step)
    )

    def wrapped(cfgs, jobs=1, progress=True, train_kwargs=None, **options):
        kwargs = dict(train_kwargs or {})
        kwargs["step_hooks"] = [*kwargs.get("step_hooks", []), hook]
        return run_all(cfgs, jobs, progress, kwargs, **options)

    return wrapped


if __name__ == "__main__":
    import scalelong.compare
    import scalelong.sweep
    import scalelong.train
    from scalelong.cli import main

    at_step, argv = int(sys.argv[1]), sys.argv[2:]
    hook = functools.partial(wait_after, at_step)
    scalelong.train.train = functools.partial(scalelong.train.train, step_hooks=[hook])  # `scalelong train`
    scalelong.compare.run_all = waiting_run_all(scalelong.compare.run_all, at_step)  # `scalelong compare`
    scalelong.sweep.run_all = waiting_run_all(scalelong.sweep.run_all, at_step)  # `scalelong sweep`
    sys.exit(main(argv))
