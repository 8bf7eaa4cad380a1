"""pool_map when one of its worker processes dies (the out-of-memory killer's SIGKILL, a crash)."""

import signal

from scalelong.errors import ScaleLongError
from scalelong.training.launch import WORKER_DIED, pool_map

# Items for the builtin eval, which the spawned workers unpickle without importing this module (see
# tests/studies/test_cluster.py). One kills its own worker as it starts; the others pause long enough
# that, when it dies, the other worker is running one of them or none and the rest have not started.
KILL = f"__import__('os').kill(__import__('os').getpid(), {int(signal.SIGKILL)})"
WORK = "__import__('time').sleep(0.2) or ({}, __import__('os').environ['CUDA_VISIBLE_DEVICES'])"


def test_a_dead_worker_fails_only_the_items_that_had_started():
    items = [(KILL,)] + [(WORK.format(i),) for i in range(1, 6)]
    results = dict(pool_map(eval, items, jobs=2, threads=1, gpus=("3", "5,6")))
    assert sorted(results) == list(range(6))
    died = sorted(i for i, r in results.items() if isinstance(r, BaseException))
    assert died[0] == 0 and len(died) <= 2  # the killed item, and the one the other worker ran, if any
    for i in died:
        assert isinstance(results[i], ScaleLongError) and "worker process died" in str(results[i])
    # the others ran (those not started, in a fresh pool whose workers have their GPUs too)
    assert all(results[i][0] == i and results[i][1] in ("3", "5,6") for i in results if i not in died)


def test_a_study_says_a_dead_worker_in_one_line(capsys):
    """The study's line for such a run is the message alone; an unexpected error keeps its kind."""
    from types import SimpleNamespace

    from scalelong.studies.running import _collect

    cfgs = [SimpleNamespace(name="a"), SimpleNamespace(name="b")]
    outcomes: dict = {}
    _collect(
        cfgs, [0, 1], iter([(0, ScaleLongError(WORKER_DIED)), (1, ValueError("bad\nvalue"))]), outcomes, None
    )
    assert outcomes[0].message == WORKER_DIED and outcomes[1].message == "ValueError: bad value"
    assert f"[1/2] a: failed: {WORKER_DIED}" in capsys.readouterr().err
