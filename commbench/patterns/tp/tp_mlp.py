"""Megatron's MLP block alone as a pattern, ``tp_mlp``: column-parallel linear, GELU,
row-parallel linear, between f and g (its record is the layer's: tp/layer_pattern.py with
``mlp_only``; the operators: tp/tp_layer_comms.py and mappings.py)."""

from __future__ import annotations

from commbench.patterns.tp.layer_pattern import LayerPattern
from commbench.patterns.tp.tp_layer import F_WITHOUT_ALL_REDUCE, NO_REPLICATED_SYNC

__all__ = ["TPMLP"]


class TPMLP(LayerPattern):
    """The MLP block alone: column-parallel, GELU, row-parallel, between f and g (Shoeybi 2019
    §3, Fig. 3a)."""

    name, markers = "tp_mlp", ("tp", "sp")
    mlp_only = True
    broken = (F_WITHOUT_ALL_REDUCE, NO_REPLICATED_SYNC)
