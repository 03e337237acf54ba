"""All-reduce on the emulated two-node cluster at several link rates, side by side.

    python suites/cluster/measure.py [--rates none,10,1] [--out DIR] [-n 10] [-e 64M]

For each rate (Gbit/s; ``none``: the link unshaped, which calibrates the host's own costs) it
shapes the link, runs ``commbench run all_reduce`` over gloo and MPI with the native, ring and
hierarchical algorithms at 8 B .. 64 MiB (factor 2) on 2 nodes x 2 ranks, and keeps the rows under
``DIR/<rate>/``. The link's byte counters before and after each rate are kept beside them.
``report.py`` turns the folders into ``results/cluster_*``. Needs root; tears the cluster down
at the end, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import emulate  # noqa: E402

ALGOS = "native,ring,hierarchical"


def rate_name(gbit: float | None) -> str:
    return "unshaped" if gbit is None else f"{gbit:g}gbit"


def volume(commbench: str, size: str = "16M") -> list[dict]:
    """Bytes each node's end of the link sends per all-reduce, per transport and algorithm: the
    counters' difference between a run of 6 and one of 2 iterations, over 4 (setup, barriers
    and warm-up cancel). Includes the TCP/IP headers of the frames."""
    out = []
    for transport in ("gloo", "mpi"):
        for algo in ALGOS.split(","):
            sent = []
            for iters in (2, 6):
                before = emulate.link_bytes()
                subprocess.run(emulate.launch([commbench, "run", "all_reduce", "--transport",
                                               transport, "--algo", algo, "-b", size, "-e", size,
                                               "-n", str(iters), "-w", "0", "-c", "0",
                                               "--no-write"]),
                               check=True, timeout=600, capture_output=True)
                sent.append([a - b for a, b in zip(emulate.link_bytes(), before, strict=True)])
            per_call = [(b - a) / 4 for a, b in zip(*sent, strict=True)]
            out.append({"transport": transport, "algo": algo, "size": size,
                        "tx_bytes_per_call": per_call})
            print(f"# link bytes per call, {transport} {algo} {size}: {per_call}", flush=True)
    return out


def measure(rates: list[float | None], out: Path, iters: int, maxbytes: str,
            timeout: float) -> None:
    commbench = str(Path(sys.executable).with_name("commbench"))
    out.mkdir(parents=True, exist_ok=True)
    emulate.up()
    try:
        (out / "volume.json").write_text(json.dumps(volume(commbench)))
        for gbit in rates:
            emulate.shape(gbit)
            folder = out / rate_name(gbit)
            folder.mkdir(parents=True, exist_ok=True)
            before, t0 = emulate.link_bytes(), time.time()
            cmd = emulate.launch([commbench, "run", "all_reduce", "--transport", "gloo,mpi",
                                  "--algo", ALGOS, "-b", "8", "-e", maxbytes, "-f", "2",
                                  "-n", str(iters), "-w", "2", "--out", str(folder),
                                  "--label", f"cluster-2x2-{rate_name(gbit)}"])
            print(f"# {rate_name(gbit)}: {' '.join(cmd[2:])}", flush=True)
            subprocess.run(cmd, check=True, timeout=timeout)
            after = emulate.link_bytes()
            (folder / "link.json").write_text(json.dumps(
                {"gbit": gbit, "seconds": time.time() - t0,
                 "tx_bytes": [a - b for a, b in zip(after, before, strict=True)]}))
    finally:
        emulate.down()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="none,10,1")
    p.add_argument("--out", default="cluster-runs")
    p.add_argument("-n", "--iters", type=int, default=8)
    p.add_argument("-e", "--maxbytes", default="64M")
    p.add_argument("--timeout", type=float, default=1800)
    a = p.parse_args()
    rates = [None if r == "none" else float(r) for r in a.rates.split(",")]
    measure(rates, Path(a.out), a.iters, a.maxbytes, a.timeout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
