"""The machine class a results file is named by: ``<suite>_<class>-<transport>-x<ranks>``.

A class is the hardware that decides the figures: the GPU model and how many this process sees
(``nvidia-h200-1gpu``), or the CPU model and the cores this process may run on
(``intel-xeon-2c``). A run on another class writes beside the committed tables, never over
them; ``--label`` (or ``COMMBENCH_HARDWARE``) names a class by hand.
"""

from __future__ import annotations

import os
import platform
import re

__all__ = ["check_label", "cores", "machine_class", "slug"]

_NOISE = re.compile(r"\((r|tm)\)|\bcpu\b|\bprocessor\b|@\s*[\d.]+\s*[gm]hz|\bwith\b.*$")


def slug(text: str) -> str:
    """Lower case, letters and digits joined by '-': a file-name-safe name."""
    return "-".join(re.findall(r"[a-z0-9]+", _NOISE.sub(" ", text.lower()))) or "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1]
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    """The cores this process may run on (its affinity where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


LABEL_MAX = 64  # characters of a machine class: results' file names stay far below 255 bytes


def check_label(label: str = "") -> str:
    """``label`` (or ``COMMBENCH_HARDWARE``), '' when neither is given; ValueError naming the
    rule it breaks. Without torch: a command checks it before anything imports torch."""
    label = label or os.environ.get("COMMBENCH_HARDWARE", "")
    if label and len(label) > LABEL_MAX:
        raise ValueError(f"--label of {len(label)} characters: at most {LABEL_MAX} (it names "
                         "the results files)")
    if label and slug(label) != label:
        raise ValueError(f"--label {label!r}: use lower-case letters, digits and '-' "
                         f"(e.g. {slug(label)!r})")
    return label


def machine_class(label: str = "") -> str:
    """``label`` (or ``COMMBENCH_HARDWARE``) when given, else this machine's class."""
    label = check_label(label)
    if label:
        return label
    # lazy: imports torch
    import torch

    if torch.cuda.is_available():
        return f"{slug(torch.cuda.get_device_name())}-{torch.cuda.device_count()}gpu"
    return f"{slug(_cpu_model())}-{cores()}c"
