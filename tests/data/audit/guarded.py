"""An optional import, guarded as scripts guard them: the audit must not refuse it."""

try:
    import not_installed_anywhere_xyz  # noqa: F401
except ImportError:
    not_installed_anywhere_xyz = None
