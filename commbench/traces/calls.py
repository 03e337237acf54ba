"""One communication call read off a trace, and the trace's names for ops and dtypes (pure).

torch's ``record_param_comms`` and NCCL's kernels carry the call's arguments: ``Collective name``
(``allreduce``, ``allgather_into_tensor_coalesced``, ``all_to_allv``, ``send``, ...), ``In msg
nelems`` / ``Out msg nelems``, ``dtype`` (``Float``, ``BFloat16``, ...), ``Group size``,
``Process Group Name`` / ``Description`` / ``Ranks``, ``Seq`` and, for all-to-allv, ``In split
size`` / ``Out split size``. A kernel's name says NCCL's algorithm and protocol:
``ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)`` (newer NCCL) or
``ncclKernel_AllReduce_RING_LL_Sum_float(...)`` (older); point-to-point runs as
``ncclDevKernel_SendRecv``.

Bytes follow nccl-tests' size column (:mod:`commbench.results.busbw`): one rank's buffer for
all-reduce, broadcast, reduce and send/recv, the whole output of an all-gather, the whole input of
a reduce-scatter, one rank's whole send of an all-to-all.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter

from commbench.ops import OPS

__all__ = ["COLLECTIVE", "CPP_TYPES", "DTYPES", "MAX_WORLD", "P2P", "PROFILER", "UNSIZED", "Call",
           "TraceError", "LIBRARIES", "kernel_choice", "kernel_word", "library_kernel",
           "library_op", "library_start", "op_of", "ranks_of", "SYMM_MEM",
           "symm_mem_op"]


class TraceError(ValueError):
    """A trace that cannot be read as one: one line naming the file and what is wrong."""


def _collective_names() -> dict[str, str]:
    out: dict[str, str] = {}
    for record in OPS.values():  # the first record to claim a name has it (send before isend)
        for name in record.names.torch:
            out.setdefault(name, record.name)
    return out


# torch's "Collective name" -> commbench's op (names of torch 2.0 to 2.13's c10d: Names.torch)
COLLECTIVE = _collective_names()
# the process group's profiler op (nccl:all_reduce, gloo:broadcast: Names.profiler) -> op
PROFILER = {name: o.name for o in OPS.values() for name in o.names.profiler}
# C++ type names, as a profiler op's ``Input type`` and an execution trace write them
CPP_TYPES = {"float": "float32", "double": "float64", "c10::Half": "float16", "half": "float16",
             "c10::BFloat16": "bfloat16", "int": "int32", "long int": "int64", "long": "int64",
             "short": "int16", "signed char": "int8", "unsigned char": "uint8", "bool": "bool",
             "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2"}
# torch's ScalarType names as the profiler writes them -> (commbench's dtype, bytes)
DTYPES = {"Float": ("float32", 4), "Double": ("float64", 8), "Half": ("float16", 2),
          "BFloat16": ("bfloat16", 2), "Long": ("int64", 8), "Int": ("int32", 4),
          "Short": ("int16", 2), "Char": ("int8", 1), "Byte": ("uint8", 1), "Bool": ("bool", 1),
          "Float8_e4m3fn": ("float8_e4m3fn", 1), "Float8_e5m2": ("float8_e5m2", 1)}
P2P = ("send", "recv")  # point-to-point calls: matched by their two ends, not by Seq
UNSIZED = "unknown"  # the dtype of a call whose trace was recorded without shapes
MAX_WORLD = 1 << 20  # a job's ranks at most (the largest are some 10^5 GPUs): a world is listed
ALGOS = ("NVLS_TREE", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "TREE", "RING", "PAT")
PROTOS = ("LL128", "LL", "SIMPLE")


@dataclass(slots=True)  # a big trace holds many: no per-object dict
class Call:
    """One call on one rank. Times in microseconds on the trace's clock; ``source`` says where
    they come from: ``kernel`` (the GPU's own run) or ``cpu`` (``record_param_comms``: on NCCL
    the time to enqueue, on gloo the blocking call)."""

    rank: int
    op: str
    name: str  # the trace's own "Collective name"
    group: tuple[int, ...]
    group_name: str
    group_desc: str
    dtype: str
    itemsize: int
    in_elems: int
    out_elems: int
    ts: float
    dur: float
    seq: int = -1
    source: str = "cpu"
    algo: str = ""
    proto: str = ""
    in_splits: tuple[int, ...] = ()
    out_splits: tuple[int, ...] = ()
    stream: str = ""
    step: int = 0
    peer: int = -1
    host_ts: float = -1.0  # a kernel's: when its CPU op started (the step it belongs to)

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def sized(self) -> bool:
        """Whether the trace holds the call's sizes (not one recorded without shapes)."""
        return self.dtype != UNSIZED

    @property
    def size(self) -> int:
        """nccl-tests' size column, bytes."""
        record = OPS.get(self.op)
        elems = record.size_elems(self.in_elems, self.out_elems) if record else self.in_elems
        return elems * self.itemsize

    def key(self) -> tuple:
        return (self.group, self.seq)

    def __reduce__(self):
        """Pickled as its fields in order (a worker hands its rank's calls back this way): a
        third of the unpickling time of a slotted object's default state."""
        return (Call, _FIELDS(self))


_FIELDS = attrgetter(*Call.__slots__)  # a call's fields in order, as one tuple (in C)


def op_of(name: str) -> str:
    """commbench's op for the trace's ``Collective name`` (itself when unknown): torch's names,
    and torch SymmetricMemory's (``symm_mem::two_shot_all_reduce``, which its ops record with
    ``record_param_comms`` in newer torch)."""
    key = name.strip().lower()
    if key.startswith("symm_mem::"):
        known = symm_mem_op(key)
        return known[0] if known else key
    return COLLECTIVE.get(key, key)


def ranks_of(text, where: str) -> tuple[int, ...]:
    """``"[0, 1, 2, 3]"`` (or a list) as a tuple of ranks."""
    if isinstance(text, list):
        raw = text
    else:
        try:
            raw = json.loads(str(text))
        except json.JSONDecodeError:
            raise TraceError(f"{where}: Process Group Ranks {text!r} is not a list of ranks") \
                from None
    if not isinstance(raw, list) or not all(isinstance(r, int) and r >= 0 for r in raw):
        raise TraceError(f"{where}: Process Group Ranks {text!r} is not a list of ranks")
    return tuple(raw)


def kernel_word(name: str) -> str:
    """The collective an NCCL (or RCCL) kernel's name says it runs: ``AllReduce`` in
    ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``SendRecv``, ``Generic`` (RCCL's)."""
    base = name.split("(", 1)[0]
    return base.split("_")[1] if base.count("_") else ""


@lru_cache(maxsize=1024)  # a trace runs a few kernels many times: one answer, one tuple each
def kernel_choice(name: str) -> tuple[str, str] | None:
    """(algorithm, protocol) from an NCCL kernel's name, ``("", "")`` for a kernel without them
    (send/recv), None when ``name`` is not NCCL's."""
    base = name.split("(", 1)[0]
    if not base.startswith(("ncclDevKernel_", "ncclKernel_")):
        return None
    parts = base.split("_")[1:]
    algo = proto = ""
    joined = "_".join(parts)
    for a in ALGOS:  # longest names first: NVLS_TREE before NVLS and TREE
        if f"_{a}_" in f"_{joined}_":
            algo = a
            break
    for p in PROTOS:
        if p in parts:
            proto = p
            break
    return algo.lower(), {"LL128": "LL128", "LL": "LL", "SIMPLE": "Simple"}.get(proto, "")


SYMM_MEM = "torch SymmetricMemory"
# communication kernels of libraries other than NCCL, each told by its namespace at the start
# of the kernel's name (a type among another kernel's template arguments does not count):
# library -> (pattern, what its kernels do, the op of each kernel word, any other's: unknown;
# or one op for every kernel the pattern takes)
LIBRARIES: dict[str, tuple[re.Pattern, str, dict[str, str] | str]] = {
    # deepseek-ai/DeepEP (namespace deep_ep; dpsk::ep in DeepSeek's own build, as its published
    # profiles name it): MoE dispatch and combine, an all-to-all of its own over NVLink and
    # RDMA, with their count exchanges and barriers (notify_dispatch, cached_notify*, barrier,
    # clean_low_latency_buffer). Its layout kernel (get_dispatch_layout) only computes.
    "DeepEP": (re.compile(r"(?:void )?(?:deep_ep|dpsk::ep)::(?:intranode|internode|internode_ll)"
                          r"::(\w+)"),
               "its own all-to-all for MoE dispatch and combine, with its count exchanges",
               {"dispatch": "all_to_all", "combine": "all_to_all"}),
    # vLLM's custom all-reduce (csrc/custom_all_reduce.cuh), and the copies of it in SGLang and
    # AMD's AITER: one-shot and two-shot all-reduce over peer memory, in place of NCCL's for
    # small tensors
    **{library: (re.compile(rf"(?:void )?{namespace}::(cross_device_reduce_[12]stage)\b"),
                 f"its custom all-reduce over {link} peer memory", "all_reduce")
       for library, namespace, link in (("vLLM", "vllm", "NVLink"), ("SGLang", "sglang", "NVLink"),
                                        ("AITER", "aiter", "xGMI"))},
    # QuickReduce (vLLM's and SGLang's on ROCm: a two-shot all-reduce that may quantise what it
    # sends)
    "QuickReduce": (re.compile(r"(?:void )?quickreduce::(allreduce_prototype_\w+?)(?:<|\(|$)"),
                    "its all-reduce over xGMI peer memory, quantised or not", "all_reduce"),
    # TensorRT-LLM's custom all-reduce (cpp/tensorrt_llm/kernels/customAllReduceKernels.cu)
    "TensorRT-LLM": (re.compile(r"(?:void )?tensorrt_llm::kernels::"
                                r"(oneShotAllReduceKernel|twoShotAllReduceKernel)\b"),
                     "its custom all-reduce over NVLink peer memory", "all_reduce"),
    # torch's SymmetricMemory (c10d/symm_mem/CUDASymmetricMemoryOps.cu, kernels in an anonymous
    # namespace; vLLM's all-reduce calls symm_mem::multimem_all_reduce_ on multicast machines):
    # one-shot, two-shot and multicast collectives over symmetric memory. Its two-shot kernel
    # also runs its reduce-scatter, and its one-shot reduce kernel its multicast all-reduce (each
    # rank its own root): their op is the launching op's (:func:`symm_mem_op`), not the name's
    SYMM_MEM: (
        re.compile(r"(?:void )?(?:\(anonymous namespace\)|<unnamed>)::((?:multimem_all_reduce"
                   r"|multimem_one_shot_reduce|multimem_all_gather|one_shot_all_reduce"
                   r"|two_shot_all_reduce|tile_reduce_scatter|mark_tile_signals)_kernel"
                   r"(?:_inplace)?)\b"),
        "its collectives over NVLink peer and multicast memory",
        {"multimem_all_reduce_kernel": "all_reduce", "one_shot_all_reduce_kernel": "all_reduce",
         "two_shot_all_reduce_kernel_inplace": "all_reduce",
         "multimem_all_gather_kernel": "all_gather",
         "tile_reduce_scatter_kernel": "reduce_scatter"}),
}
# its ops (symm_mem::<name>, out-of-place and copying variants alike) -> (the call's op, whether
# the op's input is the call's whole buffer, so that its Input Dims size the call without its
# group: not an all-gather's block nor a reduce-scatter's input of the group's size)
_SYMM_MEM_OPS = {"multimem_all_reduce": ("all_reduce", True),
                 "one_shot_all_reduce": ("all_reduce", True),
                 "two_shot_all_reduce": ("all_reduce", True),
                 "multimem_one_shot_all_reduce": ("all_reduce", True),
                 "multimem_one_shot_reduce": (PROFILER["nccl:reduce"], True),  # from its record
                 "multimem_all_gather": ("all_gather", False),
                 "reduce_scatter": ("reduce_scatter", False),
                 "tile_reduce_scatter": ("reduce_scatter", False)}
# any library's kernel, in one anchored match (most kernels' names fail it at their first
# words): a computation kernel is told so without a look at each library
library_start = re.compile("|".join(f"(?:{p.pattern})" for p, _, _ in LIBRARIES.values())).match


@lru_cache(maxsize=1024)
def library_kernel(name: str) -> tuple[str, str] | None:
    """(library, what the kernel does: ``dispatch``, ``combine``, ``notify_dispatch``,
    ``cross_device_reduce_1stage``, ...) of a communication kernel of a library other than
    NCCL (:data:`LIBRARIES`), None for any other kernel."""
    for library, (pattern, _, _) in LIBRARIES.items():
        m = pattern.match(name)
        if m:
            return library, m.group(1)
    return None


def library_op(library: str, word: str) -> str:
    """The op of a kernel :func:`library_kernel` names: its library's for that word, ``unknown``
    for one that exchanges counts or waits."""
    ops = LIBRARIES[library][2]
    return ops if isinstance(ops, str) else ops.get(word, "unknown")


def symm_mem_op(name: str) -> tuple[str, bool] | None:
    """(the call's op, whether the op's input is its whole buffer) of a torch SymmetricMemory op
    (``symm_mem::two_shot_all_reduce_``, ``symm_mem::one_shot_all_reduce_copy_out``,
    ``symm_mem::reduce_scatter_out``); None for one that is no collective (its signal and
    memset ops). An all-gather's or reduce-scatter's input sizes it only with its group's size,
    which the trace lacks."""
    base = name.removeprefix("symm_mem::").rstrip("_")
    for suffix in ("_out", "_copy"):
        base = base.removesuffix(suffix)
    return _SYMM_MEM_OPS.get(base)
