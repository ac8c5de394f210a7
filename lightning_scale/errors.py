"""Usage errors: what the user fixes in their configuration, code or environment, as opposed to failures to retry.

Every check that refuses a configuration raises one, with a message naming the problem and the fix. From Python it
is an ordinary exception (a ``ValueError`` or an ``OSError``, as before); the ``lightning-scale`` command reports it
on rank 0 in a few lines, without a traceback, and exits with :data:`USAGE_ERROR_EXIT_CODE`.
"""

from __future__ import annotations

__all__ = ["USAGE_ERROR_EXIT_CODE", "ConfigurationError", "UsageError"]

USAGE_ERROR_EXIT_CODE = 2
"""Exit code of the ``lightning-scale`` command for a usage error, as for a command line it cannot parse."""


class UsageError(Exception):
    """Marks an exception as a usage error; combined with the built-in type that callers catch."""


class ConfigurationError(UsageError, ValueError):
    """A usage error in arguments, the model's layout, the data or the checkpoint to resume from."""
