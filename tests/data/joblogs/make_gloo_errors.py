"""Write ``gloo_timeout_torchrun.log`` and ``gloo_peer_closed_torchrun.log`` with the installed
torch: what ``torchrun --nproc-per-node 3`` prints of a gloo job (group timeout 3 s) whose rank 2
skips the second of two all-reduces, and then sleeps (the others' receive and send time out) or
exits (their peer's connection closes). Absolute paths are made relative (the venv's packages,
the script's folder, the interpreter, and the folder torch was built in, which its gloo messages
print). Run from the repository root:
``.venv/bin/python tests/data/joblogs/make_gloo_errors.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = """import time
from datetime import timedelta
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=3))
x = torch.ones(4)
dist.all_reduce(x)
if dist.get_rank() == 2:
    {skip}
else:
    dist.all_reduce(x)
"""


def main() -> None:
    import torch

    packages = os.path.dirname(os.path.dirname(torch.__file__))
    for name, skip in (("gloo_timeout_torchrun.log", "time.sleep(8)"),
                       ("gloo_peer_closed_torchrun.log", "pass")):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "job.py"), "w") as f:
                f.write(JOB.format(skip=skip))
            p = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                                "--nproc-per-node", "3", "job.py"], cwd=d, capture_output=True,
                               text=True, timeout=120)
            text = (p.stdout + p.stderr).replace(packages, "site-packages").replace(
                d + os.sep, "").replace(sys.executable, "python")
            text = re.sub(r"\[/[^\]\s]*?/third_party/", "[third_party/", text)
        with open(os.path.join(HERE, name), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
