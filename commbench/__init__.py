"""commbench: collective-communication benchmark and correctness suite for distributed training."""

__version__ = "0.1.0"
