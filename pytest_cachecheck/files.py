"""Writing the run's files: atomically (a temporary file beside the target, then a rename), with every
known secret scrubbed first."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, Optional

from .model import RunReport
from .redact import scrub_data


def write_text_atomic(path: str, text: str, suffix: str = ".tmp") -> None:
    """Write text to a temporary file beside ``path``, then rename it into place."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".cachecheck-", suffix=suffix, dir=directory)
    try:
        # a lone surrogate from a server becomes \\udXXX: in JSON a valid escape, never a crash
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_report(path: str, report: RunReport, scrub: Optional[Callable[[str], str]] = None) -> None:
    """The JSON report, its strings scrubbed one by one (never the serialized text: a short secret must not
    rewrite keys or literals)."""
    data: Any = report.to_json()
    if scrub is not None:
        data = scrub_data(data, scrub)
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n", ".json.tmp")
