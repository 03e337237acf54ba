"""Which recording a replay was given: a commbench audit result, torch's execution traces, or
Kineto traces (pure)."""

from __future__ import annotations

import json
import os

from commbench.traces.calls import TraceError
from commbench.traces.et import from_et, is_et
from commbench.traces.job import files
from commbench.traces.recorded import Rec, from_audit, from_traces

__all__ = ["load"]


def load(names: list[str], limit: int | None = None,
         said: list[str] | None = None, world: int = 0) -> tuple[int, dict[int, list[Rec]]]:
    """(the recording's world size, each rank's calls) from traces or an audit result; a trace
    read up to ``limit`` characters (None: :data:`commbench.traces.stream.LIMIT`); ``said``
    gets a line for what a recording holds that cannot be re-issued; ``world``: the job's world
    size where its Kineto traces state none (:func:`commbench.traces.job.load`)."""
    if len(names) == 1 and os.path.isfile(names[0]) and not names[0].endswith(".gz"):
        try:
            with open(names[0], encoding="utf-8") as f:
                head = f.read(4096)
        except (OSError, UnicodeDecodeError) as exc:
            raise TraceError(f"{names[0]}: cannot be read ({exc})") from None
        if '"commbench.results.records' in head or '"suite": "audit"' in head:
            try:
                with open(names[0], encoding="utf-8") as f:
                    record = json.load(f)
            except (OSError, ValueError) as exc:
                raise TraceError(f"{names[0]}: not a readable audit result ({exc})") from None
            if isinstance(record, dict) and record.get("suite") == "audit":
                return from_audit(names[0], record)

    paths, _ = files(names)
    if paths and all(is_et(p) for p in paths):
        return from_et(paths, limit) if limit else from_et(paths)
    return from_traces(names, limit, said, world)
