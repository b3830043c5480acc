"""The app layer's user-facing error: printed as one message, never a traceback."""
from __future__ import annotations


class RunError(Exception):
    """A user-facing problem (bad config, bad trace): printed as one message, no traceback."""
