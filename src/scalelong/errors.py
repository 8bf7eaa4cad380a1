"""The one exception type for mistakes a user can fix (config, data, checkpoint, arguments)."""


class ScaleLongError(ValueError):
    """A user-facing error: the message says what is wrong and how to fix it.

    The command line turns it into a single line on stderr and exit code 2.
    """
