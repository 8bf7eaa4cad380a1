"""The one exception type for mistakes a user can fix (config, data, checkpoint, arguments), and
:func:`first_line`, how an error someone else raised is quoted inside one of its messages."""


class ScaleLongError(ValueError):
    """A user-facing error: the message says what is wrong and how to fix it.

    The command line turns it into a single line on stderr and exit code 2.
    """


def first_line(e: BaseException, *, lines: int = 1, name: bool = False, limit: int | None = None) -> str:
    """What went wrong, as a fragment of one line of a message: the first ``lines`` non-blank lines
    of ``str(e)``, each stripped, joined by spaces; with ``name``, after the type's name
    (``OSError: ...``); cut to ``limit`` characters where given. An empty message gives the type's
    name alone."""
    text = " ".join([line.strip() for line in str(e).splitlines() if line.strip()][:lines])
    if not text:
        return type(e).__name__
    text = f"{type(e).__name__}: {text}" if name else text
    return text if limit is None else text[:limit]
