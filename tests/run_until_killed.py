"""``python tests/run_until_killed.py AT ARGS...``: ``scalelong ARGS...`` whose runs wait to be
killed at AT. The kill-and-resume tests start it with ``train``; with ``compare`` or ``sweep`` every
run of the study waits, in this process or in ``--jobs`` workers (the hook pickles, so it reaches
them). A test in this process can also make the runs wait until a file appears
(:func:`waiting_run_all`).

AT is one of (a run of several processes, ``train --num-processes N``, has each of its processes
run this script too; RANK is a process's rank):

* ``STEP``: every process waits for good after step STEP (its log record, checkpoint and sample grid);
* ``STEP@RANK``: process RANK alone waits; the others go on into the next step's collectives;
* ``save-STEP``: the main process waits in the middle of writing the step-STEP checkpoint (its
  model weights written, the rest not), the others at the checkpoint's barrier;
* ``fail-STEP@RANK``: process RANK raises RuntimeError after step STEP, the others wait.

With RUN_UNTIL_KILLED_MARKS set to a folder, a process that begins to wait (or fails) there first
creates the file ``rank-RANK`` in it.
"""

import functools
import os
import sys
import time
from pathlib import Path

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


def rank() -> int:
    """This process's rank in a run of several processes (0 in a run of one)."""
    return int(os.environ.get("RANK", "0"))


def mark() -> None:
    """Say that this process now waits (or fails): ``$RUN_UNTIL_KILLED_MARKS/rank-RANK``."""
    folder = os.environ.get("RUN_UNTIL_KILLED_MARKS")
    if folder:
        Path(folder, f"rank-{rank()}").touch()


def parse_at(at: str) -> tuple[str, int, int | None]:
    """``"save-6"`` -> ``("save", 6, None)``, ``"4@1"`` -> ``("wait", 4, 1)`` (see the module's doc)."""
    what, _, where = at.rpartition("-")
    step, _, at_rank = where.partition("@")
    return what or "wait", int(step), int(at_rank) if at_rank else None


def stop_at(what: str, at_step: int, at_rank: int | None, step: int, trainer) -> None:
    """A step hook: after step ``at_step``, wait for good or (``fail``) raise, as AT says."""
    if step != at_step or what == "save":
        return
    if what == "fail" and rank() == at_rank:
        mark()
        raise RuntimeError(f"a failure planted after step {step} (tests/run_until_killed.py)")
    if what == "fail" or at_rank is None or rank() == at_rank:
        mark()
        while True:
            time.sleep(0.5)


def pause_in_save(at_step: int) -> None:
    """Make the main process wait for good in the middle of writing the step-``at_step`` checkpoint,
    once its first file is written."""
    import scalelong.training.checkpoint as checkpoint

    write = checkpoint.save_file
    folder = checkpoint.TMP_PREFIX + checkpoint.step_dir_name(at_step)

    def save_file(tensors, path, *args, **kwargs):
        write(tensors, path, *args, **kwargs)
        if Path(path).parent.name == folder:
            mark()
            while True:
                time.sleep(0.5)

    checkpoint.save_file = save_file


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
    import scalelong.studies.compare.entry
    import scalelong.studies.sweep.entry
    import scalelong.training.launch
    import scalelong.training.train
    from scalelong.cli import main

    at, argv = sys.argv[1], sys.argv[2:]
    what, at_step, at_rank = parse_at(at)
    if what == "save":
        pause_in_save(at_step)
    hook = functools.partial(stop_at, what, at_step, at_rank)
    scalelong.training.train.train = functools.partial(
        scalelong.training.train.train, step_hooks=[hook]
    )  # `scalelong train`
    # the processes of `scalelong train --num-processes N` run this script too, with the same AT
    scalelong.training.launch.WORKER_PROGRAM = [os.path.abspath(__file__), at]
    scalelong.studies.compare.entry.run_all = waiting_run_all(
        scalelong.studies.compare.entry.run_all, at_step
    )  # `scalelong compare`
    scalelong.studies.sweep.entry.run_all = waiting_run_all(
        scalelong.studies.sweep.entry.run_all, at_step
    )  # `scalelong sweep`
    sys.exit(main(argv))
