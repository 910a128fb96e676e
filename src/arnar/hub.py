"""Fail fast where weights would come from a hub: one place that says whether we are offline.

Model hubs' own downloaders retry for tens of seconds (or wait with no timeout) before failing,
which is no way to learn that a machine is offline. Loaders therefore look in the package's
cache first, then call :func:`unreachable` (one HEAD request with a short timeout), and skip
the network entirely when :func:`offline_requested` is true.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request

OFFLINE_VARIABLES = ("ARNAR_OFFLINE", "HF_HUB_OFFLINE")
_TRUE = {"1", "ON", "YES", "TRUE"}


def offline_requested() -> bool:
    """True if ARNAR_OFFLINE or HF_HUB_OFFLINE is set to a true value."""
    return any(os.environ.get(var, "").strip().upper() in _TRUE for var in OFFLINE_VARIABLES)


def unreachable(url: str, timeout: float) -> str | None:
    """None if a server answers ``url`` within ``timeout`` s (any HTTP status), else the reason."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError:  # the server answered: the network is there
        return None
    except (urllib.error.URLError, OSError, ValueError) as err:
        return str(getattr(err, "reason", err))


def require_cached_or_reachable(
    target, url: str, *, offline: bool, timeout: float, what: str, todo: str, error: type[Exception]
) -> None:
    """Return if the weights file ``target`` exists or ``url`` answers; else raise ``error`` with
    ``what`` (what is missing), why (offline, or the network's reason) and ``todo`` (how to fix)."""
    from pathlib import Path

    if Path(target).is_file():
        return
    if offline:
        raise error(f"{what} and offline mode is on; {todo}")
    reason = unreachable(url, timeout)
    if reason is not None:
        raise error(f"{what} and {url} cannot be reached ({reason}); {todo}")
