"""The package's version, read by the command line and written into every results record."""

__version__ = "0.1.0"
