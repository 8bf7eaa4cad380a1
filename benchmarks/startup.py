"""The command line's start-up as a ratio to `import torch`: its target is at most 1.5x for each command.

Why: the command line's start-up stays within 1.5x of importing torch, so that `scalelong --help`, a
refused value and a dry run answer at once; a user checking a config or fixing a typo waits for the
interpreter and torch, and the command line may add at most half of that again. Timed: `scalelong info
demo` (the config and model of the demo preset), `scalelong train demo optim.lr=abc` (refused: one
`error:` line, exit code 2) and `scalelong train demo --dry-run`, each a fresh process of one OpenMP
thread, round-robin with `python -c "import torch"` so that drift on the machine hits all of them alike;
the ratio of medians travels between machines, the seconds do not. Each command is first run once and
its exit code checked (0, or 2 for the refused value), so what is timed is the command and not an error.

    python -m benchmarks.startup            # 10 interleaved repeats
    python -m benchmarks.startup --quick    # 3
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import interleaved_medians, markdown_table, ratios, write_result

TARGET = 1.5  # each command's median / import torch's
CLI = [sys.executable, "-m", "scalelong.cli"]
# one thread, as the benchmark's other processes: a start-up is not a parallel region
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def commands(folder: Path) -> dict[str, tuple[list[str], int]]:
    """name: (command, the exit code it must answer with); ``torch`` first, the baseline."""
    return {
        "torch": ([sys.executable, "-c", "import torch"], 0),
        "info": ([*CLI, "info", "demo"], 0),
        "refused": ([*CLI, "train", "demo", "optim.lr=abc"], 2),  # one `error:` line
        # the dry run writes nothing, but should it ever, it writes into a folder that goes away
        "dry-run": ([*CLI, "train", "demo", f"out_dir={folder}", "--dry-run"], 0),
    }


def run(name: str, cmd: list[str], expected: int, cwd: Path) -> None:
    """Run ``cmd`` once; a different exit code means something else than the command would be timed."""
    done = subprocess.run(cmd, env=ENV, cwd=cwd, capture_output=True, text=True)
    if done.returncode != expected:
        said = " / ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        typed = shlex.join(["python", *cmd[1:]])
        raise RuntimeError(f"{name!r} ({typed}) exited with {done.returncode}, expected {expected}: {said}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    p.add_argument("--repeats", type=int, default=0, help="interleaved repeats (0: 10, --quick 3)")
    args = p.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 10)
    with tempfile.TemporaryDirectory(prefix="startup_") as tmp:
        folder = Path(tmp)  # also the working directory: a command that writes leaves nothing behind
        cmds = commands(folder / "runs")
        for name, (cmd, code) in cmds.items():  # checked before timing; also the warm-up
            run(name, cmd, code, folder)
        fns = {n: lambda n=n, c=c, e=e: run(n, c, e, folder) for n, (c, e) in cmds.items()}
        median = interleaved_medians(fns, repeats=repeats, warmup=0)
        # as a user would type them, the temporary folder named as such
        shown = {n: shlex.join(["python", *c[1:]]).replace(tmp, "$TMP") for n, (c, _) in cmds.items()}
    ratio = ratios(median, "torch")
    met = {name: r <= TARGET for name, r in ratio.items()}
    rows = [
        [
            name,
            f"`{shown[name]}`",
            f"{median[name]:.2f}",
            f"{ratio[name]:.2f}",
            "baseline" if name == "torch" else ("met" if met[name] else "**not met**"),
        ]
        for name in median
    ]
    table = markdown_table(["command", "runs", "median s", "/ import torch", f"≤ {TARGET}"], rows)
    head = f"# The command line's start-up / `import torch` ({repeats} interleaved repeats, one thread)"
    print(table)
    result = {
        "repeats": repeats,
        "target": TARGET,
        "commands": shown,
        "median_s": median,
        "ratio": ratio,
        "met": met,
        "table": table,
    }
    name = "startup" + ("_quick" if args.quick else "")
    print(f"wrote {write_result(name, result, head + chr(10) * 2 + table)}")


if __name__ == "__main__":
    main()
