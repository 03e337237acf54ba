"""The names the command line accepts, without importing torch: collectives, dtypes, reductions,
and the other tools' names for the same collectives (nccl-tests' binaries, OSU's benchmarks).
The collectives and their names are their records' (:mod:`commbench.ops`)."""

from __future__ import annotations

import importlib

from commbench.ops import OPS, benchmarked

__all__ = ["ALIASES", "COLLECTIVES", "DTYPE_NAMES", "ITEMSIZE", "MPI_CANNOT_REDUCE", "REDOPS",
           "ROOTED", "SUITE", "UNITS", "canonical", "check_dtype", "named", "parse_size", "size_text",
           "sizes_between"]

COLLECTIVES = benchmarked()
# the default suite (commbench run, make bench): the collectives of the committed tables
SUITE = tuple(op for op in COLLECTIVES if OPS[op].suite)
# collectives with a root rank (-r)
ROOTED = tuple(op for op in COLLECTIVES if OPS[op].rooted)
DTYPE_NAMES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64")
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1,
            "int32": 4, "int64": 8}
REDOPS = ("sum", "prod", "min", "max", "avg")
# the dtypes above MPI cannot reduce, and why, by name: what the command line refuses before any
# rank starts (tests/test_collectives.py holds it to MPIBackend.unsupported, which reads torch)
MPI_CANNOT_REDUCE = {"bfloat16": "MPI has no reduction for this dtype"}


def named(name: str, package: str):
    """The object ``"module:attribute"`` names, the module under ``package``: how a record names
    code that imports torch without importing it (found when it runs)."""

    module, _, attr = name.partition(":")
    if not attr:
        raise ValueError(f"{name!r}: a part is named 'module:attribute'")
    return getattr(importlib.import_module(f"{package}.{module}"), attr)


def check_dtype(name: str, allowed: tuple[str, ...] = DTYPE_NAMES) -> None:
    """Raise ValueError naming the value and the rule unless ``name`` is one of ``allowed``."""
    if name not in allowed:
        raise ValueError(f"dtype={name!r}: must be one of {', '.join(allowed)}")


def _aliases() -> dict[str, str]:
    out: dict[str, str] = {}
    for op in COLLECTIVES:
        flat = op.replace("_", "")  # allreduce, alltoall, sendrecv
        for name in (flat, f"{op}_perf", f"{flat}_perf", f"osu_{flat}", f"osu_{op}"):
            out.setdefault(name, op)
    for op in COLLECTIVES:  # OSU's own names (osu_bcast; osu_latency: half a round trip)
        out.update(dict.fromkeys(OPS[op].names.osu, op))
    return {k: v for k, v in out.items() if k not in COLLECTIVES}


# nccl-tests' binary names (all_reduce_perf), OSU's (osu_allreduce), and the flat spellings
ALIASES = _aliases()


def canonical(name: str) -> str:
    """The collective ``name`` stands for, or ``name`` itself when it is not an alias of one."""
    return ALIASES.get(name, name)

# size suffixes, powers of two as nccl-tests reads them
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``"8"``, ``"64K"``, ``"16M"``, ``"1G"`` (powers of two, as nccl-tests reads them)."""
    t = str(text).strip().upper().removesuffix("B")
    unit = t[-1] if t and t[-1] in UNITS else ""
    num = t[: -1] if unit else t
    try:
        value = int(num) * UNITS[unit]
    except ValueError:
        raise ValueError(f"size {text!r}: write a whole number with an optional K, M or G") from None
    if value <= 0:
        raise ValueError(f"size {text!r}: must be > 0")
    return value


def size_text(nbytes: int) -> str:
    """``nbytes`` as :func:`parse_size` reads it, in the largest unit it is a whole number of."""
    for unit in ("G", "M", "K"):
        if nbytes >= UNITS[unit] and nbytes % UNITS[unit] == 0:
            return f"{nbytes // UNITS[unit]}{unit}"
    return str(nbytes)


def sizes_between(begin: int, end: int, factor: int) -> list[int]:
    if begin <= 0:
        raise ValueError(f"-b {begin}: must be > 0")
    if end < begin:
        raise ValueError(f"-e {end} is below -b {begin}: the sweep would be empty")
    if factor < 2:
        raise ValueError(f"-f {factor}: must be >= 2")
    out, s = [], begin
    while s <= end:
        out.append(s)
        s *= factor
    return out
