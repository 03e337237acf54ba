"""nccl-tests' JSON output (``-J FILE.json``, nccl-tests 2.19 and later), read as the same runs
as its text log (:mod:`commbench.results.nccl_tests`). Pure: no torch.

What the file holds (``"version": 3`` as nccl-tests 2.19.6 writes it; facts:
``docs/nccl-tests.md``): ``args`` (the command line, whose first word names the test:
``all_reduce_perf``), ``env`` (the whole environment: not read, not kept), ``nccl_version``
(``22809`` for 2.28.9), ``config`` (``nthreads``, ``ngpus``, ``minimum_bytes``,
``maximum_bytes``, ``warmup_iters``, ``iterations``, ``validation``, ``graph``, and ``devices``:
one per rank with ``rank``, ``pid``, ``hostname``, ``device``, ``device_hex``, ``device_info``),
``results`` (one per size: ``size``, ``count``, ``type``, ``redop``, ``root``, and
``out_of_place`` / ``in_place``, each ``time`` in us (``cpu_time`` under ``-C 1``), ``alg_bw``,
``bus_bw`` and ``nwrong``, null where nothing was checked; under ``-I 1`` also
``out_of_place_per_iter`` / ``in_place_per_iter``: ``min_us``, ``max_us``, ``p99_us`` and every
iteration's ``times_us``, the first ``skipped_iterations`` left out of the summary),
``average_bus_bandwidth``, ``errors`` and ``end_time`` (written when the test ended). The file
carries no nccl-tests version. A row's ``line`` is its place among the results (1 for the
first).
"""

from __future__ import annotations

import json

from commbench.results.nccl_tests import (
    DTYPES,
    Device,
    LogError,
    Row,
    Run,
    Timing,
    by_algbw,
    parse,
    perf_op,
    settle_op,
)

__all__ = ["is_json", "parse_json", "runs_of"]

# the text log's columns, which the JSON's results stand for
COLUMNS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
           "algbw", "busbw", "#wrong")
PARAMS = {"nthreads": "nThread", "ngpus": "nGpus", "minimum_bytes": "minBytes",
          "maximum_bytes": "maxBytes", "validation": "validation", "graph": "graph",
          "warmup_iters": "warmup_iters", "iterations": "iters",
          "aggregated_iterations": "agg_iters"}


def is_json(text: str) -> bool:
    """Whether ``text`` is JSON rather than a text log (its first character)."""
    return text.lstrip()[:1] == "{"


def _timing(half: dict | None, per_iter, where: str) -> Timing | None:
    """One half (``time``, or ``cpu_time`` under ``-C 1``), with its iterations' spread where
    ``-I 1`` wrote one (``per_iter``: ``min_us``, ``max_us``, ``p99_us``, and ``times_us``, the
    first ``skipped_iterations`` of which its summary leaves out, as this does)."""
    if half is None:
        return None
    if not isinstance(half, dict):
        raise LogError(f"{where}: not an object of time, alg_bw, bus_bw, nwrong")
    try:
        wrong = half.get("nwrong")
        t = half["cpu_time"] if "cpu_time" in half and "time" not in half else half["time"]
        spread = _per_iter(per_iter) if isinstance(per_iter, dict) else {}
        return Timing(float(t), float(half["alg_bw"]), float(half["bus_bw"]),
                      None if wrong is None or isinstance(wrong, str) else int(wrong), **spread)
    except (KeyError, TypeError, ValueError):
        raise LogError(f"{where}: time, alg_bw or bus_bw missing or not a number") from None


def _per_iter(d: dict) -> dict:
    skip = d.get("skipped_iterations", 0)
    times = d.get("times_us")
    samples = tuple(float(x) for x in times[skip if isinstance(skip, int) else 0:]) \
        if isinstance(times, list) else ()
    return {"min_us": float(d["min_us"]), "max_us": float(d["max_us"]),
            "p99_us": float(d["p99_us"]), "samples": samples}


def _row(res: dict, k: int, name: str) -> Row:
    where = f"{name}: results[{k}]"
    if not isinstance(res, dict):
        raise LogError(f"{where}: not an object")
    try:
        size, count = int(res["size"]), int(res["count"])
        root = int(str(res.get("root", -1)).strip() or -1)
    except (KeyError, TypeError, ValueError):
        raise LogError(f"{where}: size, count or root missing or not a whole number") from None
    dtype = str(res.get("type", ""))
    out = _timing(res.get("out_of_place"), res.get("out_of_place_per_iter"),
                  f"{where}.out_of_place")
    if out is None:
        raise LogError(f"{where}: no out_of_place timing")
    return Row(size, count, DTYPES.get(dtype, (dtype, 0))[0], str(res.get("redop", "none")),
               root, out, _timing(res.get("in_place"), res.get("in_place_per_iter"),
                                  f"{where}.in_place"), k + 1)


def parse_json(text: str, name: str = "log") -> list[Run]:
    """The one run of a JSON output file; :class:`LogError` naming the file when it is no such
    file."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LogError(f"{name}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise LogError(f"{name}: JSON nested too deeply to be nccl-tests' output") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list) \
            or not isinstance(doc.get("config"), dict):
        raise LogError(f"{name}: JSON without nccl-tests' 'config' and 'results': not its "
                       "output (-J FILE.json)")
    run = Run(tool="nccl-tests", columns=COLUMNS, first_line=1, closed="end_time" in doc)
    args = doc.get("args")
    if isinstance(args, list) and args and (op := perf_op(str(args[0]))):
        run.op, run.op_from = op, "command"
    code = doc.get("nccl_version")
    if isinstance(code, int) and code > 0:
        run.library = f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    config = doc["config"]
    run.params = {PARAMS[k]: v for k, v in config.items() if k in PARAMS and isinstance(v, int)}
    for k, d in enumerate(config.get("devices") or []):
        try:
            run.devices.append(Device(int(d["rank"]), int(d.get("pid", 0)), str(d["hostname"]),
                                      int(d.get("device", 0)), str(d.get("device_hex", "")),
                                      str(d.get("device_info", ""))))
        except (KeyError, TypeError, ValueError):
            raise LogError(f"{name}: config.devices[{k}]: rank or hostname missing") from None
    run.rows = [_row(res, k, name) for k, res in enumerate(doc["results"])]
    run.cputime = any(isinstance(res, dict) and isinstance(res.get("out_of_place"), dict)
                      and "cpu_time" in res["out_of_place"] for res in doc["results"])
    avg = doc.get("average_bus_bandwidth")
    if isinstance(avg, dict) and isinstance(avg.get("bandwidth"), int | float):
        run.avg_busbw = float(avg["bandwidth"])
    errors = [str(e) for e in doc.get("errors") or [] if e]
    run.failure = "; ".join(errors)
    by_algbw(run)
    settle_op(run, name)
    return [run]


def runs_of(text: str, name: str = "log") -> list[Run]:
    """The runs of a log file's contents, text or JSON output alike."""
    return parse_json(text, name) if is_json(text) else parse(text, name)
