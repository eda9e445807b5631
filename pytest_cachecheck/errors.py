"""The project's own exceptions; the plugin maps them to pytest outcomes."""

from __future__ import annotations

from typing import Optional


class CachecheckError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(CachecheckError):
    """A bad or conflicting setting; the plugin turns it into ``pytest.UsageError``."""


class RequestError(CachecheckError):
    """A request to a server failed: refused, timed out, an HTTP error or a malformed body.

    Never a divergence: the probe that sent it is an error.
    """

    def __init__(self, message: str, *, status: Optional[int] = None, where: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.where = where


class ServerSetupError(CachecheckError):
    """The server cannot be measured as configured (no model, counters not reported, ...)."""


class ModelChoiceError(ServerSetupError):
    """The server does not serve the model asked for, or serves several and none was chosen: a usage error,
    found by asking the server before any probe request."""


class WrongModel(CachecheckError):
    """A server answered under another model name than the one the run resolved: the answer is another
    model's, so the probe or episode that asked is inconclusive (the setup checks: a setup problem)."""


class JudgeError(CachecheckError):
    """A test's own judge (``cachecheck.check(..., judge=fn)``) raised something other than AssertionError:
    an error of the check, never a flip. The record (with the error) is in the report all the same."""
