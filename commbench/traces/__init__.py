"""A job's own traces: the PyTorch profiler's (Kineto) per-rank JSON read in one pass
(:mod:`.kineto`), its calls matched across ranks and held against the wire (:mod:`.analysis`,
:mod:`.wire`), written by the audit (:mod:`.write`) and by a generator of NCCL-kernel traces with
known figures (:mod:`.generate`), and replayed on any world (:mod:`.replay`). Pure except replay:
no torch is imported to read a trace."""
