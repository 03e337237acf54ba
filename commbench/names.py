"""The names the command line accepts, without importing torch: collectives, dtypes, reductions,
and the other tools' names for the same collectives (nccl-tests' binaries, OSU's benchmarks)."""

from __future__ import annotations

__all__ = ["ALIASES", "COLLECTIVES", "DTYPE_NAMES", "ITEMSIZE", "REDOPS", "ROOTED", "canonical"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
               "gather", "scatter", "sendrecv", "pingpong")
# collectives with a root rank (-r)
ROOTED = ("broadcast", "reduce", "gather", "scatter")
DTYPE_NAMES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64")
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1,
            "int32": 4, "int64": 8}
REDOPS = ("sum", "prod", "min", "max", "avg")


def _aliases() -> dict[str, str]:
    out: dict[str, str] = {}
    for op in COLLECTIVES:
        flat = op.replace("_", "")  # allreduce, alltoall, sendrecv
        for name in (flat, f"{op}_perf", f"{flat}_perf", f"osu_{flat}", f"osu_{op}"):
            out.setdefault(name, op)
    out.update(osu_latency="pingpong", osu_bcast="broadcast")  # OSU: half a round trip
    return {k: v for k, v in out.items() if k not in COLLECTIVES}


# nccl-tests' binary names (all_reduce_perf), OSU's (osu_allreduce), and the flat spellings
ALIASES = _aliases()


def canonical(name: str) -> str:
    """The collective ``name`` stands for, or ``name`` itself when it is not an alias of one."""
    return ALIASES.get(name, name)
