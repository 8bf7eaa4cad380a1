"""Command line: ``scalelong train | info | configs | sample | eval | fid-stats | compare | sweep | analyze |
extract-features``.

One module per command group adds its parsers and holds its command bodies: :mod:`.training`
(train, info, configs), :mod:`.evaluation` (sample, fid-stats, eval), :mod:`.studies` (compare,
sweep, analyze) and :mod:`.t2i` (extract-features); :mod:`.arguments` holds what they share. This
module builds the parser from them and runs a command.

Every mistake a user can make (config, data, checkpoint, arguments) ends in one line on stderr
and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from scalelong.cli import evaluation, studies, t2i, training
from scalelong.errors import ScaleLongError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        raise ScaleLongError(f"{self.prog}: {message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    """The ``scalelong`` parser with every command group's subcommands, in the order ``--help`` lists them."""
    parser = _Parser(
        prog="scalelong", description="ScaleLong: scaled long skip connections for diffusion training"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for group in (training, evaluation, studies, t2i):
        group.add_commands(sub)
    return parser


def one_line(message: str) -> str:
    """A message on one line, whatever a library folded into it."""
    return " ".join(part.strip() for part in message.strip().splitlines() if part.strip())


def main(argv: list[str] | None = None) -> int:
    """Run one ``scalelong`` command (``argv``, default ``sys.argv[1:]``) and return its exit code:
    0, or 2 after one line on stderr for any mistake of the user's."""
    parser = build_parser()
    try:
        # Overrides may stand before or after options; argparse alone keeps only the first run.
        args, extra = parser.parse_known_args(argv)
        unknown = [a for a in extra if a.startswith("-") or not hasattr(args, "overrides")]
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        if extra:
            args.overrides = [*args.overrides, *extra]
        return args.func(args)
    except ScaleLongError as e:
        if int(os.environ.get("RANK", "0")) == 0:  # one line per run, not one per process
            print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; the run directory holds the last complete checkpoint", file=sys.stderr)
        return 2


def _exit_as_worker(code: int) -> None:
    """A process of a multi-process run ends with exactly its exit code: the interpreter's teardown
    can abort (SIGABRT, "terminate called without an active exception") in the process group's
    destructors, also after a run that succeeded, and its launcher would then report a crash."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(argv: list[str] | None = None) -> None:
    """The ``scalelong`` command: :func:`main`, then exit with its code. A process of a multi-process
    run (started by the product's launcher, ``accelerate launch`` or ``torchrun``) skips the
    interpreter's teardown."""
    code = main(argv)
    # SCALELONG_LAUNCHER_PID: scalelong.training.launch.LAUNCHER_PID (not imported: it imports torch)
    if os.environ.get("SCALELONG_LAUNCHER_PID") or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _exit_as_worker(code)
    sys.exit(code)
