"""A child that dies with its parent: Linux's parent-death signal, set between fork and exec."""

from __future__ import annotations

import signal

try:  # resolved here, in the parent: preexec_fn runs between fork and exec and must stay tiny
    import ctypes

    _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def parent_death_signal() -> None:
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the driver
