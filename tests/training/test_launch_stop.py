"""_Launch.stop() when Ctrl-C or SIGTERM reaches the launcher while it waits for its processes to end."""

import os
import signal
import subprocess
import sys

import pytest

from scalelong.training import launch

# A launched process that outlives SIGTERM (stuck in a collective, say): only the SIGKILL ends it.
STUBBORN = "import signal as s, time; s.signal(s.SIGTERM, s.SIG_IGN); print(flush=True); time.sleep(60)"


class SignalledInWait(subprocess.Popen):
    """A process whose first wait gets ``signum`` sent to the test's own process (none: no signal)."""

    signum: int | None = None

    def wait(self, timeout=None):
        signum, self.signum = self.signum, None  # once: its handler may raise before the next line
        if signum is not None:
            os.kill(os.getpid(), signum)
        return super().wait(timeout)


def interrupt(signum, frame):  # what SIGTERM does after sigterm_as_interrupt (the outer one of a study)
    raise KeyboardInterrupt


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_stop_still_kills_a_process_that_ignores_sigterm(signum, monkeypatch):
    monkeypatch.setattr(launch, "STOP_GRACE_S", 0.2)
    child = SignalledInWait([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
    child.stdout.readline()  # it ignores SIGTERM from here on
    child.signum = signum
    stopping = launch._Launch(1, None)
    stopping.procs.append(child)
    previous = signal.signal(signum, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):  # the interrupt comes once stop() is done, not lost
            stopping.stop()
        assert child.poll() == -signal.SIGKILL
    finally:
        signal.signal(signum, previous)
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdout.close()
