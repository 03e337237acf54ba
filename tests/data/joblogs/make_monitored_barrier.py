"""Write ``gloo_monitored_barrier_rank0.log`` with the installed torch: the lines torch prints
on rank 0's stderr about ``torch.distributed.monitored_barrier`` in a 3-rank gloo job whose
rank 2 never reaches it (the script prints nothing of its own). Run from the repository root:
``.venv/bin/python tests/data/joblogs/make_monitored_barrier.py``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 3


def rank_main(rank: int, port: int) -> None:
    import time
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    if rank == 2:
        time.sleep(4)  # never reaches the barrier in time
        return
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=2), wait_all_ranks=True)
    except RuntimeError:
        pass  # torch has logged who did not arrive


def main() -> None:
    if len(sys.argv) == 3:
        rank_main(int(sys.argv[1]), int(sys.argv[2]))
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(port)],
                              stderr=subprocess.PIPE, text=True) for r in range(WORLD)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    with open(os.path.join(HERE, "gloo_monitored_barrier_rank0.log"), "w") as f:
        f.write("".join(line for line in errs[0].splitlines(keepends=True)
                        if "monitoredBarrier" in line))


if __name__ == "__main__":
    main()
