"""Pipeline schedules: the order in which each rank runs forward (F) and backward (B) passes.

A model of L layers is cut into p*v chunks of L/(p*v) layers; chunk c runs on rank c mod p
(Megatron's interleaving: with v virtual stages a rank holds v chunks that are p apart). A micro-
batch flows through chunks 0, 1, ..., p*v-1 forward and back in reverse.

* GPipe (Huang et al. 2019): every forward of every micro-batch, then every backward.
* 1F1B (PipeDream-Flush, Narayanan et al. 2021 §2.2): p - r - 1 warm-up forwards on rank r, then
  one forward and one backward in turn, then the remaining backwards; at most p - r micro-batches
  of activations are alive on rank r, against m for GPipe.
* interleaved 1F1B (Narayanan et al. 2021 §2.2, virtual stages): the same with v chunks per rank,
  forwards taken p micro-batches at a time per chunk; the bubble shrinks by v.

Bubble fraction of the total time, t_f and t_b per micro-batch per stage: (p-1)/(m+p-1) for GPipe
and 1F1B; (p-1)/(v*m + p-1) interleaved.
"""

from __future__ import annotations

__all__ = ["SCHEDULES", "bubble_fraction", "interleaved_warmup", "schedule"]

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def _interleaved_chunk(k: int, p: int, v: int, forward: bool) -> tuple[int, int]:
    """(local chunk, micro-batch) of a rank's k-th forward (or backward) in the interleaved order."""
    group, within = divmod(k, p * v)
    local = within // p
    return (local if forward else v - 1 - local), group * p + within % p


def interleaved_warmup(p: int, rank: int, m: int, v: int) -> int:
    """Forwards rank ``rank`` runs before its first backward in the interleaved schedule."""
    return min((p - rank - 1) * 2 + (v - 1) * p, m * v)


def schedule(name: str, p: int, rank: int, m: int, v: int = 1) -> list[tuple[str, int, int]]:
    """This rank's actions: ("F" or "B", global chunk, micro-batch), in the order it runs them."""
    if name == "gpipe":
        return [("F", rank, j) for j in range(m)] + [("B", rank, j) for j in range(m)]
    if name == "1f1b":
        warm = min(p - rank - 1, m)
        out = [("F", rank, j) for j in range(warm)]
        for i in range(m - warm):
            out += [("F", rank, warm + i), ("B", rank, i)]
        return out + [("B", rank, j) for j in range(m - warm, m)]
    if name == "interleaved":
        total = m * v
        warm = interleaved_warmup(p, rank, m, v)

        def fwd(k):
            local, mb = _interleaved_chunk(k, p, v, True)
            return ("F", local * p + rank, mb)

        def bwd(k):
            local, mb = _interleaved_chunk(k, p, v, False)
            return ("B", local * p + rank, mb)

        out = [fwd(k) for k in range(warm)]
        for i in range(total - warm):
            out += [fwd(warm + i), bwd(i)]
        return out + [bwd(k) for k in range(total - warm, total)]
    raise ValueError(f"schedule {name!r}: must be one of {', '.join(SCHEDULES)}")


def bubble_fraction(name: str, p: int, m: int, v: int = 1) -> float:
    """Idle share of the pipeline's total time with equal stages, backward = 2 x forward."""
    if name == "interleaved":
        return (p - 1) / (v * m + p - 1)
    return (p - 1) / (m + p - 1)
