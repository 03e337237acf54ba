"""Megatron tensor (and sequence) parallelism as a pattern: ``tp_layer``, the transformer layer
(its MLP block alone: tp/tp_mlp.py; the layer's predicted calls and tolerance:
tp/layer_pattern.py; the column- and row-parallel linears, the step and the broken parts:
tp/tp_layer_comms.py; f and g and the SP all-gather / reduce-scatter: mappings.py; the
config: tp/configs.py; the oracle: tp/model.py)."""

from __future__ import annotations

from commbench.patterns.base import Broken
from commbench.patterns.tp.configs import TPConfig
from commbench.patterns.tp.layer_pattern import LayerPattern

__all__ = ["F_WITHOUT_ALL_REDUCE", "NO_REPLICATED_SYNC", "TPLayer", "example_configs"]


def example_configs(P: int) -> list[TPConfig]:
    return [TPConfig(batch=2, seq=2 * P, hidden=4 * P, ffn=2 * P, heads=P, vocab=2 * P, tp=P,
                     dtype=dtype) for dtype in ("float64", "float32")]


# the broken variants the layer and its MLP block share
F_WITHOUT_ALL_REDUCE = Broken("f_without_all_reduce", "tp",
                              {"f": "tp.tp_layer_comms:copy_without_all_reduce"},
                              "f whose backward forgets the all-reduce", example_configs)
NO_REPLICATED_SYNC = Broken("no_replicated_sync", "sp",
                            {"sync_replicated": "tp.tp_layer_comms:no_replicated_sync"},
                            "SP without the TP sum of LayerNorm and row-bias gradients",
                            example_configs)


class TPLayer(LayerPattern):
    """Megatron-LM's transformer layer (Shoeybi 2019; SP: Korthikanti 2022), TP x DP."""

    name, markers = "tp_layer", ("tp", "sp")
    layout_layer = True
    broken = (
        F_WITHOUT_ALL_REDUCE,
        Broken("heads_off_by_one", "tp", {"shard": "tp.tp_layer_comms:heads_off_by_one"},
               "attention heads sharded one head too far", example_configs),
        NO_REPLICATED_SYNC,
    )

