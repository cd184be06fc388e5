"""The one exception type that means "the user asked for something we cannot do".

Anything raised as a :class:`UserError` reaches the command line as a single line
``jaxnet: error: ...`` with exit code 2 and no traceback. Everything else is a bug and keeps
its traceback.
"""


class UserError(Exception):
    """Bad input from the user: a config value, a data file, a workdir.

    The message should say what was wrong and what to do about it, in one line.
    """
