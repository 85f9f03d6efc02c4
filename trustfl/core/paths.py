"""Paths a user names (a config file, ``--out``, a run directory, ``data.path``, ``model.init_from``), looked up
once before anything else touches them, so that a path the file system refuses is a one-line error naming it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trustfl.errors import ConfigError, TrustFLError


def looked_up(path: Any, what: str, error: type[TrustFLError] = ConfigError) -> Path:
    """``path`` as a ``Path`` once the file system can look it up, else ``error`` naming ``what`` and the path: a
    name longer than the file system takes, a path too long, a NUL byte, a symbolic-link loop, a directory on the
    way that may not be searched (each an OSError or ValueError from the next ``exists()``). A path that does not
    exist passes: its caller says what it expected there."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise error(f"{what} {str(path)!r} cannot be looked up: {reason}.") from None
    return Path(path)
