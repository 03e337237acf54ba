"""commbench: collective-communication benchmark and correctness suite for distributed training.

``commbench.audit(step, *args)`` books every collective one call of ``step`` issues on this rank;
``with commbench.watch(ledger):`` books them into a ledger of your own. Both load torch on first
use, so that ``import commbench`` (and ``commbench --help``) stays light.
"""

from commbench.version import __version__

__all__ = ["__version__", "audit", "watch"]


def __getattr__(name: str):
    if name == "audit":
        # lazy: the package's attribute, imported on first use (import commbench stays light)
        from commbench.studies.audit import audit

        return audit
    if name == "watch":
        # lazy: imports torch
        from commbench.wire.watch import watch

        return watch
    raise AttributeError(f"module 'commbench' has no attribute {name!r}")
