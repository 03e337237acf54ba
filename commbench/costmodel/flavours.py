"""Whose data-parallel calls the layout predicts (``--impl``): each library's calls per step, as
(op, elements per call, bytes per element, calls per step), from its documented behaviour at
the versions of the ``libs`` extra, each checked against the library's own booked calls
(tests/test_audit_libs.py, tests/test_audit_layout.py).

* ``megatron``: ZeRO's stage calls of one flat vector (:func:`commbench.costmodel.layout.dp_calls`);
  with ``zero`` >= 1 that vector is megatron-core 0.16's distributed optimizer's padded gradient
  buffer (:func:`megatron_buffer`), and each step all-reduces the gradients' norm
  (``grad_norm``; :func:`commbench.costmodel.layout._norm`).
* ``fsdp2``: torch 2.13's ``fully_shard`` on every layer and on the root (:func:`fsdp2_calls`).
* ``deepspeed``: DeepSpeed 0.19.8's ZeRO (:func:`deepspeed_calls`).
* ``torch-ddp``: torch 2.13's DistributedDataParallel after its buckets are rebuilt
  (:func:`ddp_buckets`).

A layer's parameters (:func:`layer_params`) are those of the layout's transformer layer, in
registration order: LayerNorm weight and bias, q, k, v and output projections, LayerNorm weight
and bias, the MLP's two matrices, no biases in the linears (examples/layers.py is that layer) or,
with ``bias``, each linear's bias after its weight (Megatron's ``add_bias_linear``); with tp > 1
the matrices and the column-parallel biases are split, the LayerNorms and the row-parallel
biases replicated, in Megatron as in torch.
"""

from __future__ import annotations

import json
from collections import Counter
from math import lcm

__all__ = ["DDP_CAP", "DS_BUCKET", "DS_PERSIST", "DS_PREFETCH", "FIRST_BUCKET", "NORMS", "ddp_buckets",
           "deepspeed_calls", "ds_buckets", "ds_config", "fsdp2_calls", "layer_modules",
           "layer_params", "megatron_buckets", "megatron_buffer", "torch_tp_arrival",
           "zero3_gathers"]

Calls = list[tuple[str, int, int, int]]

DS_BUCKET = 500_000_000   # DeepSpeed's reduce_bucket_size and allgather_bucket_size (elements)
DS_PREFETCH = 50_000_000  # DeepSpeed's stage3_prefetch_bucket_size (elements)
DS_PERSIST = 100_000      # DeepSpeed's stage3_param_persistence_threshold (elements)
FIRST_BUCKET = 1 << 20    # torch's dist._DEFAULT_FIRST_BUCKET_BYTES
DDP_CAP = 25 << 20        # torch's default bucket_cap_mb (25 MiB)


def layer_modules(h: int, kv_d: int, f: int, t: int, bias: bool = False) -> list[list[int]]:
    """One layer's modules (a LayerNorm, each linear), each its parameters' elements on one TP
    rank, in registration order (above): the matrices split over the ``t`` TP ranks, the
    LayerNorms' weight and bias whole (replicated over TP); with ``bias``, each linear's bias
    after its weight, split with the column-parallel ones (q, k, v, the MLP's first) and whole
    with the row-parallel ones (output projection, the MLP's second)."""
    q, k, v, o = (x // t for x in (h * h, h * kv_d, h * kv_d, h * h))
    fc1, fc2 = h * f // t, f * h // t
    if not bias:
        return [[h, h], [q], [k], [v], [o], [h, h], [fc1], [fc2]]
    return [[h, h], [q, h // t], [k, kv_d // t], [v, kv_d // t], [o, h], [h, h], [fc1, f // t],
            [fc2, h]]


NORMS = (0, 5)  # the LayerNorms' places among a layer's modules (layer_modules)


def layer_params(h: int, kv_d: int, f: int, t: int, bias: bool = False) -> list[int]:
    """One layer's parameters' elements on one TP rank, in registration order: its modules'
    (:func:`layer_modules`) one after another."""
    return [p for module in layer_modules(h, kv_d, f, t, bias) for p in module]


def megatron_buckets(params: list[int], n: int, bucket_size: int) -> list[int]:
    """Elements of each bucket of megatron-core 0.16's gradient buffer under its distributed
    optimizer with ``overlap_grad_reduce`` (``bucket_size`` elements each, roughly): the
    parameters taken last to first (the order backward makes their gradients), each starting
    at a multiple of 64 elements; a bucket closes once it holds ``bucket_size`` or more, its
    end rounded up to a multiple of lcm(n, 128) so that it cuts into n equal, aligned shards;
    the last parameters make the last bucket. Each bucket is reduce-scattered whole and its
    shard all-gathered. Measured on examples/megatron_core_distopt.py at a bucket size of
    2000: [2048, 2304, 2176, 128]."""
    unit, out = lcm(n, 128), []
    start = end = 0  # the open bucket's start, the last parameter's end
    for p in reversed(params):
        end = -(-end // 64) * 64 + p
        if end - start >= bucket_size:
            closed = -(-end // unit) * unit
            out.append(closed - start)
            start = end = closed
    if end > start:
        out.append(-(-end // unit) * unit - start)
    return out


def megatron_buffer(params: list[int], n: int) -> int:
    """Elements of megatron-core 0.16's gradient buffer under its distributed optimizer
    (``_ParamAndGradBuffer``, one bucket: ``overlap_grad_reduce`` off, the default) for
    ``params`` over a data-parallel group of ``n``: each parameter starts at a multiple of 64
    elements (128-byte alignment), and the bucket ends at a multiple of lcm(n, 128), so that it
    cuts into n equal, aligned shards. The reduce-scatter takes the whole buffer, the
    all-gather a shard."""

    aligned = sum(-(-p // 64) * 64 for p in params)
    return -(-aligned // lcm(n, 128)) * lcm(n, 128)


def fsdp2_calls(per_layer: int, layers: int, root: int, n: int, m: int, g: int,
                reshard: bool = True, p: int = 0, accumulate: bool = False) -> Calls:
    """torch 2.13's FSDP2 with ``fully_shard`` on each of ``layers`` layers of ``per_layer``
    elements and on the root (``root`` elements: the embedding and head), over ``n`` ranks,
    ``m`` micro-batches, in ``g``-byte elements: per micro-batch each layer all-gathers its
    shard for forward and, resharded after it (``reshard_after_forward``, the default), again
    for backward, and reduce-scatters its gradient; the root gathers once per micro-batch (it
    is not resharded after forward) and reduce-scatters its gradient (sizes divisible by n:
    FSDP2 pads each parameter's dim 0). Every layer is resharded after its backward, so each
    micro-batch gathers again. With a ``MixedPrecisionPolicy`` the gathers are in its
    ``param_dtype`` (``p`` bytes) and the reduce-scatters in its ``reduce_dtype`` (``g``).
    Accumulating (``accumulate``: ``set_requires_gradient_sync(False)`` on all but the last
    micro-batch) reduce-scatters once per step; the gathers stay per micro-batch."""
    p, r = p or g, 1 if accumulate else m
    calls = [("all_gather", per_layer // n, p, (2 if reshard else 1) * layers * m),
             ("reduce_scatter", per_layer, g, layers * r)]
    if root:
        calls += [("all_gather", root // n, p, m), ("reduce_scatter", root, g, r)]
    return calls


def _chunks(total: int, cap: int) -> list[int]:
    """``total`` elements in calls of at most ``cap``: the bytes exact, the cut approximate
    (DeepSpeed cuts its buckets at parameter boundaries)."""
    k = max(1, -(-total // cap))
    return [total // k + (1 if i < total % k else 0) for i in range(k)]


def _counted(calls: list[tuple[str, int, int]], times: int) -> Calls:
    """Equal calls as one, with how often they run (``times`` each), in first-seen order."""
    return [(op, count, e, k * times) for (op, count, e), k in Counter(calls).items()]


def ds_config(path: str) -> dict:
    """The settings of a DeepSpeed config file (``ds_config``) the ``deepspeed`` flavour
    prices: ``stage``, ``reduce_bucket_size``, ``stage3_prefetch_bucket_size``,
    ``stage3_param_persistence_threshold`` and ``gradient_accumulation_steps`` when it says
    them; ValueError naming the file and what is wrong with it."""

    try:
        with open(path) as f:
            config = json.load(f)
    except OSError as e:
        raise ValueError(f"ds_config={path!r}: {e.strerror.lower()}") from None
    except ValueError as e:
        raise ValueError(f"ds_config={path!r}: not JSON ({e})") from None
    zero = config.get("zero_optimization", {}) if isinstance(config, dict) else None
    if not isinstance(zero, dict):
        raise ValueError(f"ds_config={path!r}: needs an object with a zero_optimization object")
    out = {k: zero[k] for k in ("stage", "reduce_bucket_size", "stage3_prefetch_bucket_size",
                                "stage3_param_persistence_threshold") if k in zero}
    if "gradient_accumulation_steps" in config:
        out["gradient_accumulation_steps"] = config["gradient_accumulation_steps"]
    for k, v in out.items():
        least = 0 if k in ("stage", "stage3_param_persistence_threshold") else 1
        if type(v) not in (int, float) or v < least or v != int(v):
            raise ValueError(f"ds_config={path!r}: {k}={v!r}: must be a whole number >= {least}")
    return {k: int(v) for k, v in out.items()}


def ds_buckets(params: list[int], cap: int, arrival: bool) -> list[int]:
    """DeepSpeed 0.19.8's gradient buckets of ``params`` (registration order) at
    ``reduce_bucket_size`` ``cap`` elements: a parameter that would take the bucket past the
    cap first sends the bucket as it is. ZeRO-1 walks the parameters in registration order
    after backward; ZeRO-2 and 3 in the order the gradients arrive (``arrival``: the reverse,
    for a model run front to back). Measured on examples/layers.py at a cap of 2000."""
    out, acc = [], 0
    for p in (reversed(params) if arrival else params):
        if acc and acc + p > cap:
            out.append(acc)
            acc = 0
        acc += p
    return out + ([acc] if acc else [])


def zero3_gathers(modules: list[list[int]], n: int, prefetch: int = DS_PREFETCH,
                  persist: int = 0) -> tuple[list[int], list[int]]:
    """DeepSpeed 0.19.8's ZeRO-3 parameter all-gathers over ``n`` ranks, in elements per rank:
    (those of each micro-batch, those of each step). A parameter of at most ``persist``
    elements (``stage3_param_persistence_threshold``) is persistent: gathered alone, once a
    step (after the optimizer's step changed it), and kept. The others are fetched module by
    module in the order the forward runs them (``modules``: each module's parameters): the
    module about to run and, while the fetch holds fewer than ``prefetch`` elements
    (``stage3_prefetch_bucket_size``, the parameters' whole sizes), the modules after it, in
    one all-gather of their padded shards (ceil(p / n) each); gathered once a micro-batch and
    kept through backward. Measured on examples/deepspeed_zero.py (tests/test_audit_libs.py):
    a prefetch of 1100 gathers [1056, 656, 912, 512] of its 2 x 3136, a threshold of 16 its
    eight 16-element LayerNorm tensors one by one."""
    kept = [-(-p // n) for module in modules for p in module if p <= persist]
    fetched = [[p for p in module if p > persist] for module in modules]
    fetched = [module for module in fetched if module]
    chunks, i = [], 0
    while i < len(fetched):
        parts: list[int] = []
        while i < len(fetched) and (not parts or sum(parts) < prefetch):
            parts += fetched[i]
            i += 1
        chunks.append(sum(-(-p // n) for p in parts))
    return chunks, kept


def deepspeed_calls(zero: int, psi: int, n: int, m: int, g: int,
                    params: list[int] | None = None, bucket: int = DS_BUCKET,
                    modules: list[list[int]] | None = None, prefetch: int = DS_PREFETCH,
                    persist: int = 0) -> Calls:
    """DeepSpeed 0.19.8's ZeRO for ``psi`` gradient elements over ``n`` ranks, ``m``
    micro-batches (``gradient_accumulation_steps``), ``g``-byte gradients, steady state (from
    the third step on; the first two trace ZeRO-3's parameter order):

    * stages 1 and 2: the whole gradient all-reduced (``reduce_bucket_size`` buckets) and,
      after the optimizer's step on this rank's partition, the partitions all-gathered
      (``allgather_bucket_size``); stage 1 reduces once per step, at the accumulation
      boundary, stage 2 after every micro-batch's backward. About 1.5x the bytes of the
      reduce-scatter the ``megatron`` flavour makes.
    * stage 3: the parameters gathered as :func:`zero3_gathers` cuts them, given the modules
      (``modules``), the prefetch bucket and the persistence threshold (the model within the
      live-parameter limit: kept through backward); without the modules, every parameter
      sharded and the shards gathered in ``prefetch``-sized parts; the gradient
      reduce-scattered once per micro-batch (``reduce_bucket_size`` buckets).
    * every stage: one all-reduce of the gradients' norm per step (float32; float64 in stage
      3), whether or not clipping is on.

    Given the parameters (``params``, registration order), the gradient buckets are cut at
    parameters as DeepSpeed cuts them (:func:`ds_buckets`, ``reduce_bucket_size`` ``bucket``);
    without, in equal parts. ``allgather_bucket_size`` cuts nothing: the partitions are
    gathered by one ``all_gather_into_tensor`` wherever torch has it."""
    if zero not in (1, 2, 3):
        raise ValueError(f"impl='deepspeed': zero={zero}: must be 1, 2 or 3")
    c = -(-psi // n)
    cuts = ds_buckets(params, bucket, zero > 1) if params else None
    if zero == 3:
        each, once = zero3_gathers(modules, n, prefetch, persist) if modules else \
            (_chunks(c, prefetch // n), [])
        gathers = [("all_gather", k, g) for k in each]
        reduce = [("reduce_scatter", k, g) for k in cuts or _chunks(c * n, bucket)]
        times: Counter = Counter()
        for call in gathers + reduce:  # each micro-batch
            times[call] += m
        for k in once:  # the persistent tensors, each step
            times["all_gather", k, g] += 1
        return [(*call, t) for call, t in times.items()] + [("all_reduce", 1, 8, 1)]
    reduce = [("all_reduce", k, g) for k in cuts or _chunks(psi, bucket)]
    gather = [("all_gather", c, g)]
    return (_counted(reduce, m if zero == 2 else 1) + _counted(gather, 1)
            + [("all_reduce", 1, 4, 1)])


def torch_tp_arrival(modules: list[list[int]], sharded: list[bool]) -> list[int]:
    """The order DDP's rebuild sees the gradients of ``modules`` (registration order, each its
    tensors) under torch's TP (``_pre_dp_module_transform``): the ``sharded`` modules' weights
    are DTensors rebuilt from DDP's local tensors before the model runs, so each one's
    gradient reaches its local tensor through a ``from_local`` node made before any other,
    which the autograd engine runs last: the plain modules' gradients (the LayerNorms',
    replicated; under SP those are DTensors too) arrive first, last layer first, then the
    sharded ones, last first. Measured on examples/ddp_layers.py ``--tp 2``: the 8 LayerNorm
    tensors, then fc2, fc1, o, v, k, q of the last layer, then the layer before it."""
    plain = [p for m, s in zip(modules, sharded, strict=True) if not s for p in m]
    split = [p for m, s in zip(modules, sharded, strict=True) if s for p in m]
    return plain[::-1] + split[::-1]


def ddp_buckets(params: list[int], g: int, cap_bytes: int, first_bytes: int,
                rebuilt: bool = True, arrival: list[int] | None = None) -> list[int]:
    """torch 2.13's DistributedDataParallel's buckets of ``params`` (registration order,
    ``g``-byte gradients): a bucket closes once it holds at least its limit, the first
    bucket's ``first_bytes``, every later one's ``cap_bytes`` (``bucket_cap_mb``; left at its
    default, 25 MiB with a first bucket of 1 MiB, else the first is the cap too). After its
    first iteration DDP rebuilds them in the order the gradients arrived (the reverse of
    registration, for a model run front to back; the first iteration is the set-up's: mark
    the step); with ``find_unused_parameters`` it never rebuilds (``rebuilt`` False): buckets
    cut in registration order, the last one's gradients reduced first. Each bucket is one
    all-reduce of its elements per synchronised backward. ``arrival``: the order the gradients
    arrive where it is not the reverse of registration (:func:`torch_tp_arrival`)."""
    out, acc, limit = [], 0, first_bytes
    order = params if not rebuilt else arrival if arrival is not None else params[::-1]
    for p in order:
        acc += p
        if acc * g >= limit:
            out.append(acc)
            acc, limit = 0, cap_bytes
    if acc:
        out.append(acc)
    return out
