"""megatron-core's own tensor-parallel linears: one step of an MLP block (ColumnParallelLinear
up, RowParallelLinear down) with sequence parallelism, or without (``--no-sp``).

    pip install 'commbench[libs]'       # megatron-core (and DeepSpeed, for the Ulysses example)
    commbench audit examples/megatron_core_sp.py --np 2

With SP, Megatron all-gathers the sequence shards before the column linear and gathers them
again in backward to form the weight gradient (it keeps the shard, not the gathered input): two
all-gathers in backward, where commbench's layout without ``regather`` counts one. On a CPU-only
machine megatron-core asks ``torch.cuda.current_device`` for its device: patched to the CPU.

Shapes: x [s/P, b, h] (SP) or [s, b, h]; up [., b, f/P]; down [s/P, b, h] (SP) or [s, b, h].
"""

import argparse

import torch
import torch.distributed as dist

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-sp", action="store_true")
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=64)
    a = ap.parse_args()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"
    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    P, sp = dist.get_world_size(), not a.no_sp
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=P)
    cfg = ModelParallelConfig(tensor_model_parallel_size=P, sequence_parallel=sp,
                              use_cpu_initialization=True, params_dtype=torch.float32)
    init = torch.nn.init.xavier_normal_
    up = ColumnParallelLinear(a.hidden, a.ffn, config=cfg, init_method=init, bias=True,
                              gather_output=False)
    down = RowParallelLinear(a.ffn, a.hidden, config=cfg, init_method=init, bias=True,
                             input_is_parallel=True, skip_bias_add=False)
    torch.manual_seed(0)
    x = torch.randn(a.seq // P if sp else a.seq, a.batch, a.hidden, requires_grad=True)
    y, _ = up(x)
    z, _ = down(torch.relu(y))
    z.pow(2).mean().backward()
    parallel_state.destroy_model_parallel()
