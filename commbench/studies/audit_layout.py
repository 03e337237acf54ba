"""An audited step against the calls its layout should make (``commbench audit --layout``).

The layout (:mod:`commbench.costmodel.layout`) predicts rank 0's calls per step on each group
axis (tp, cp, ep, dp, edp, pp) from the patterns. Rank 0's booked calls are put on the same axes
by their ranks (Megatron's order, TP fastest; a point-to-point call by the group that holds its
peer), then counted per (axis, op, elements) against the prediction, a send whether blocking or
not (``isend`` is a ``send``, ``irecv`` a ``recv``). Each difference is flagged with what a
reader looks for:

* ``extra``/``missing``: more or fewer calls of that op and size than the layout makes (an
  all-gather the model has no reason for, a re-gather the layout was not told of);
* ``dtype``: a call in another width than the layout's (``act_bytes`` on tp/cp/ep,
  ``grad_bytes`` on dp/edp, FSDP2's ``param_bytes`` for its parameter gathers): a gradient
  reduction in fp32 where bf16 was meant, parameters gathered in fp32 where a mixed-precision
  policy would gather bf16;
* a call in its own width (the float32 or float64 gradient norm): ``dtype`` says that width;
* ``same bytes per step, cut differently``: the elements of an op on an axis add up to the
  layout's in calls of other sizes (DeepSpeed's buckets cut at other parameters), one line
  in place of an extra and a missing per size;
* ``size``: as many calls of an op on an axis as the layout makes, of another size: one line
  with the difference (and its cause where the flavour knows it);
* ``unexpected group``: a call on ranks that are none of the layout's groups (a point-to-point
  call: rank 0 and a peer that share none).

With pp > 1, rank 0 is the first stage: its pp calls are that stage's (the activations of each
micro-batch sent on, their gradients received back: the ``pp`` pattern's, whatever the
schedule's order), and the layout must say ``loss=none`` (the layout prices the head and loss
on the last stage and not the first stage's embedding).
"""

from __future__ import annotations

from dataclasses import fields

from tabulate import tabulate

from commbench.costmodel.layout import GRADIENT_GROUPS, _calls, group_ranks, layout_axes
from commbench.costmodel.layout_config import Layout
from commbench.names import ITEMSIZE
from commbench.ops import bufferless
from commbench.wire.ledger import Entry

__all__ = ["compare", "layout_groups", "layout_tables", "parse_layout"]

KIND = {"isend": "send", "irecv": "recv"}  # a point-to-point call, blocking or not


def _width(axis: str) -> str:
    """The layout's setting for the width of ``axis``'s elements."""

    return "grad_bytes" if axis in GRADIENT_GROUPS else "act_bytes"


def parse_layout(spec: str, world_size: int) -> Layout:
    """``tp=2,sp,hidden=64,...`` (the ``predict layout`` flags, ``_`` or ``-``; a bare name sets
    a flag) as a validated Layout for ``world_size`` ranks, or ValueError naming the item."""
    kinds = {f.name: type(f.default) for f in fields(Layout)}
    values: dict = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        key, eq, raw = item.partition("=")
        key = key.replace("-", "_")
        if key not in kinds:
            raise ValueError(f"--layout {item!r}: no such setting; known: {', '.join(kinds)}")
        kind = kinds[key]
        if not eq:
            if kind is not bool:
                raise ValueError(f"--layout {item!r}: needs a value ({key}=...)")
            values[key] = True
            continue
        try:
            values[key] = raw.lower() in ("1", "true", "yes") if kind is bool else kind(raw)
        except ValueError:
            raise ValueError(f"--layout {item!r}: {raw!r} is not a {kind.__name__}") from None
    lay = Layout(**values)
    lay.validate()
    if lay.pp > 1 and lay.loss != "none":
        raise ValueError(f"--layout pp={lay.pp} with loss={lay.loss!r}: rank 0 is the first "
                         "stage, whose embedding the layout does not price; give loss=none")
    if lay.ranks != world_size:
        raise ValueError(f"--layout: tp*cp*dp*pp = {lay.ranks} ranks; the audit runs "
                         f"{world_size}")
    return lay


def layout_groups(lay: Layout) -> dict[tuple[int, ...], tuple[str, ...]]:
    """Every group of the layout: ranks -> the axes it serves (with dp = 1, the cp ranks are
    also the gradients' dp group), groups of one rank left out."""

    out: dict[tuple[int, ...], tuple[str, ...]] = {}
    for axis in layout_axes(lay):
        for r in range(lay.ranks):
            ranks = group_ranks(lay, axis, r)
            if len(ranks) > 1 and axis not in out.get(ranks, ()):
                out[ranks] = (*out.get(ranks, ()), axis)
    return out


def _predicted(lay: Layout) -> tuple[dict[tuple[str, str, int], int], dict[tuple, int]]:
    """(axis, op, elements) -> calls per step; and the width of those in another width than
    their axis's (DeepSpeed's float64 gradient norm)."""

    out: dict[tuple[str, str, int], int] = {}
    widths: dict[tuple, int] = {}
    for axis, calls in _calls(lay, stage=0).items():  # rank 0: the first stage
        for call, times in calls:
            width = getattr(call, "itemsize", 0) or getattr(lay, _width(axis))
            key = (axis, KIND.get(call.op, call.op), call.size // width)
            out[key] = out.get(key, 0) + times
            if width != getattr(lay, _width(axis)) or getattr(call, "itemsize", 0):
                widths[key] = width
    return out, widths


def compare(lay: Layout, entries: list[tuple], steps: int = 1) -> dict:
    """Rank 0's booked entries of ``steps`` steps against the layout: rows (axis, op, elements,
    dtypes, predicted, observed, flag) and the flags, one line each."""
    groups = layout_groups(lay)
    counts, widths = _predicted(lay)
    predicted = {k: v * steps for k, v in counts.items()}
    seen: dict[tuple[str, str, int], int] = {}
    dtypes: dict[tuple[str, str, int], set[str]] = {}
    flags: list[str] = []
    stray: dict[tuple, int] = {}
    for e in map(Entry._make, entries):
        if len(e.group) < 2 or bufferless(e.op):
            continue
        op = KIND.get(e.op, e.op)
        if e.peer >= 0:  # a point-to-point call: on the layout's group holding both ends
            axes = tuple(x for ranks, held in groups.items() if {0, e.peer} <= set(ranks)
                         for x in held) or None
        else:
            axes = groups.get(tuple(sorted(e.group)))
        if axes is None:
            ranks = tuple(sorted({0, e.peer})) if e.peer >= 0 else e.group
            stray[(ranks, op)] = stray.get((ranks, op), 0) + 1
            continue
        axis = next((x for x in axes if (x, op, e.count) in predicted), axes[0])
        key = (axis, op, e.count)
        seen[key] = seen.get(key, 0) + 1
        dtypes.setdefault(key, set()).add(e.dtype)
    for (group, op), n in sorted(stray.items()):
        flags.append(f"unexpected group: {n} {op} on ranks {list(group)}, none of the layout's "
                     "groups")
    explained = _explained(lay, predicted, seen)
    rows = []
    for key in sorted(set(predicted) | set(seen)):
        axis, op, count = key
        want, got = predicted.get(key, 0), seen.get(key, 0)
        flag = ""
        if (axis, op) in explained:  # its one line, said once; its rows labelled
            label, said = explained[axis, op]
            if want != got and said not in flags:
                flags.append(said)
            flag = label if want != got else ""
        elif got > want:
            flag = (f"extra {op}: {got - want} more of {count} elements on {axis} than the "
                    f"layout makes ({want})")
        elif got < want:
            flag = (f"missing {op}: {want - got} fewer of {count} elements on {axis} than the "
                    f"layout makes ({want})")
            if axis in ("mp", "world") and lay.impl == "deepspeed":  # the only call there
                flag += (": the gradients' norm DeepSpeed sums over the model-parallel ranks "
                         "of the mpu it is given, every step")
            elif axis in ("mp", "world"):
                flag += (": the gradients' norm megatron-core's optimizer all-reduces every "
                         "step (grad-norm=0: a script without that optimizer)")
        own = widths.get(key, 0)  # a call in its own width (DeepSpeed's float64 norm)
        width = own or getattr(lay, _width(axis))
        wrong = sorted(d for d in dtypes.get(key, ()) if ITEMSIZE.get(d) != width)
        if wrong:
            if _width(axis) == "act_bytes":
                what, setting = "activations", "act_bytes"
            elif op == "all_gather":  # on a gradient group a gather carries parameters
                what, setting = "gathered parameters", "param_bytes" if lay.param_bytes \
                    else "grad_bytes"
            else:
                what, setting = "gradients", "grad_bytes"
            why = (f"the layout's {what} are {width} B per element ({setting}={width})"
                   if getattr(lay, setting) == width else
                   f"the layout makes this call in {width} B per element")
            dflag = f"dtype: {op} of {count} elements on {axis} in {', '.join(wrong)}; {why}"
            if (axis, op) in explained:  # the count said once above; the dtype still here
                flags.append(dflag)
            flag = f"{flag}; {dflag}" if flag else dflag
        if flag and (axis, op) not in explained:
            flags.append(flag)
        rows.append({"axis": axis, "op": op, "elements": count,
                     "dtype": ",".join(sorted(dtypes.get(key, ()))) or "-",
                     "predicted": want, "observed": got, "flag": flag})
    return {"rows": rows, "flags": flags}


def _explained(lay: Layout, predicted: dict, seen: dict) -> dict[tuple[str, str], tuple]:
    """(axis, op) -> (the rows' label, its one flag) where the sizes of an op on an axis whose
    counts differ tell one story, said once instead of an extra and a missing per size:

    * ``cut differently``: they move the same elements per step in the layout and in the
      script, in calls of other sizes (DeepSpeed's buckets cut at other parameters);
    * ``resized``: the script makes as many calls as the layout, of one other size: the same
      calls, with the difference, and its cause where the flavour knows it (megatron-core's
      padded buffer)."""
    differ: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    for axis, op, count in sorted(set(predicted) | set(seen)):
        want, got = predicted.get((axis, op, count), 0), seen.get((axis, op, count), 0)
        if want != got:
            differ.setdefault((axis, op), []).append((count, want, got))

    def said(cut: list[tuple[int, int]]) -> str:
        return " + ".join(f"{k} x {count}" for count, k in cut if k) or "none"

    out = {}
    for (axis, op), rows in differ.items():
        total = sum(c * w for c, w, _ in rows)
        missing = [(c, w - g) for c, w, g in rows if w > g]
        extra = [(c, g - w) for c, w, g in rows if g > w]
        if total and total == sum(c * g for c, _, g in rows):
            out[axis, op] = ("cut differently", (
                f"same bytes per step, cut differently: {op} on {axis}, {total} elements as "
                f"{said([(c, g) for c, _, g in rows])} where the layout makes "
                f"{said([(c, w) for c, w, _ in rows])}"))
        elif len(missing) == len(extra) == 1 and missing[0][1] == extra[0][1]:
            (x, k), (y, _) = missing[0], extra[0]
            why = ""
            if lay.impl == "megatron" and lay.zero and axis == "dp" and lay.flat_params != \
                    lay.dense_params and x in (lay.flat_params,
                                               lay.flat_params // (lay.dp * lay.cp)):
                why = ("; the layout pads megatron-core's distributed-optimizer buffer: "
                       f"{lay.dense_params} parameters become {lay.flat_params}")
            out[axis, op] = ("resized", f"size: {k} {op} on {axis} of {y} elements where the "
                                        f"layout makes {x} ({y - x:+d} each){why}")
    return out


def layout_tables(lay: dict, seen: str) -> tuple[str, str]:
    """A comparison's table (``seen``: the observed column's name) and its verdict lines."""

    rows = tabulate([[r["axis"], r["op"], r["elements"], r["dtype"], r["predicted"],
                      r["observed"], r["flag"]] for r in lay["rows"]],
                    headers=["axis", "op", "elements", "dtype", "layout", seen, "flag"],
                    tablefmt="github")
    verdict = ("\n".join(f"- {f}" for f in lay["flags"]) if lay["flags"]
               else "No difference: every call is one the layout makes.")
    return rows, verdict
