"""Write this folder's flight recorder dumps with the installed torch: real dumps of a gloo job
(torch 2.13 records gloo's collectives too), without stack traces (they hold the machine's
paths). Run from the repository root: ``.venv/bin/python tests/data/flight/make_dumps.py``.

* ``hang/``: 4 ranks; three all-reduces on the world, an all-gather on each half ([0, 1],
  [2, 3]); then ranks 0, 1 and 3 issue a fourth all-reduce and rank 2 does not. Pickled, as
  torch's watchdog writes them.
* ``desync/``: 2 ranks; an all-reduce, then rank 0 an all-reduce of 1024 floats where rank 1
  broadcasts 512. JSON (``_dump_fr_trace_json``).

Each rank dumps once every rank has issued what it will (a barrier on a second store), then
exits without waiting for the calls left in flight.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def rank_main(scenario: str, rank: int, world: int, port: int, out: str) -> None:
    from datetime import timedelta

    import torch
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank,
                            world_size=world)
    x = torch.ones(1024)
    if scenario == "hang":
        halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        for _ in range(3):
            dist.all_reduce(x)
        mine = halves[rank // 2]
        dist.all_gather_into_tensor(torch.empty(2048), x, group=mine)
        if rank != 2:
            dist.all_reduce(x, async_op=True)
        data = c10d._dump_fr_trace(True, False, False)
        name = f"nccl_trace_rank_{rank}"
    else:
        dist.all_reduce(x)
        if rank == 0:
            dist.all_reduce(x, async_op=True)
        else:
            dist.broadcast(torch.ones(512), src=0, async_op=True)
        data = c10d._dump_fr_trace_json(True, False)
        name = f"nccl_trace_rank_{rank}.json"
    # every rank has issued what it will: dump, then leave the calls in flight behind
    store.add("issued", 1)
    store.wait(["issued"])
    while int(store.add("issued", 0)) < world:
        pass
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
    store.add("dumped", 1)
    if rank == 0:
        while int(store.add("dumped", 0)) < world:
            pass
    os._exit(0)


def main() -> None:
    for scenario, world in (("hang", 4), ("desync", 2)):
        out = os.path.join(HERE, scenario)
        os.makedirs(out, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "64"}
        procs = [subprocess.Popen([sys.executable, __file__, scenario, str(r), str(world),
                                   str(port), out], env=env) for r in range(world)]
        if any(p.wait(timeout=120) for p in procs):
            raise SystemExit(f"{scenario}: a rank failed")
        print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) == 6:
        rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        main()
