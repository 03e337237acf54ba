"""megatron-core's own data parallelism: its DistributedDataParallel over the transformer-shaped
layers of examples/layers.py with its DistributedOptimizer (``use_distributed_optimizer``,
``clip_grad=1.0``, megatron-core's defaults otherwise), ``--steps`` steps each marked for the
audit's ``--step``: per step the padded gradient buffer reduce-scattered (``finish_grad_sync``),
the gradients' norm all-reduced and the updated parameters all-gathered (the optimizer's
``step``; megatron-core 0.16 takes the norm whatever ``--clip-grad`` says), the calls of
``predict layout --impl megatron --zero 1``. With ``--tp T``: megatron-core's column- and
row-parallel linears in each layer (``MegatronLayer``) on a (dp, tp) grid, the calls of
``tp=T``; ``--sp`` adds its sequence parallelism (``finalize_model_grads`` then sums the
LayerNorms' gradients over TP), the calls of ``tp=T,sp,regather``.

    pip install 'commbench[libs]'
    commbench audit examples/megatron_core_distopt.py --np 2 --step 2 --layout zero=1,dp=2,\\
layers=2,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=1,loss=none,act-bytes=4

CPU stand-ins (megatron-core is written for CUDA devices): its tensors made with
``device='cuda'`` are made on the CPU, ``Tensor.cuda()`` keeps a tensor where it is,
``Tensor.type()`` answers as for a CUDA tensor (the optimizer accepts only those),
``torch.cuda.current_device`` names the CPU and ``torch.cuda.synchronize`` does nothing. None
of them touches what is communicated.
"""

import argparse

import torch
import torch.distributed as dist
from layers import Layer, shape_args  # examples/layers.py
from torch.overrides import TorchFunctionMode

try:
    import commbench

    step = commbench.audit.step  # marks the step for commbench audit --step
except ImportError:  # without commbench
    from contextlib import nullcontext as step


class OnCPU(TorchFunctionMode):
    """megatron-core's CUDA tensors on the CPU (the module docstring's stand-ins)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "cuda" in str(kwargs.get("device", "")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        return func(*args, **kwargs)


class MegatronLayer(torch.nn.Module):
    """examples/layers.py's layer in megatron-core's tensor-parallel linears, as Megatron's own
    layer splits it: q, k and v fused in one column-parallel linear (``linear_qkv``), the
    output projection row-parallel, the MLP's first matrix column- and its second
    row-parallel, the LayerNorms replicated (torch's, on every TP rank; under sequence
    parallelism marked ``sequence_parallel``, so that ``finalize_model_grads`` sums their
    gradients over TP). Megatron's sequence-first shapes on a TP rank: x [s, b, h] (SP:
    [s/t, b, h]) -> qkv [s, b, 3h/t] -> [s, b, h] (SP: [s/t, b, h])."""

    def __init__(self, h: int, f: int, config) -> None:
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        super().__init__()
        init = torch.nn.init.xavier_normal_
        col = dict(config=config, init_method=init, bias=False, gather_output=False)
        row = dict(config=config, init_method=init, bias=False, input_is_parallel=True,
                   skip_bias_add=True)
        self.ln1 = torch.nn.LayerNorm(h)
        self.qkv = ColumnParallelLinear(h, 3 * h, **col)
        self.o = RowParallelLinear(h, h, **row)
        self.ln2 = torch.nn.LayerNorm(h)
        self.fc1 = ColumnParallelLinear(h, f, **col)
        self.fc2 = RowParallelLinear(f, h, **row)
        for ln in (self.ln1, self.ln2):
            for w in ln.parameters():
                w.sequence_parallel = config.sequence_parallel

    def forward(self, x):
        q, k, v = (t.transpose(0, 1) for t in self.qkv(self.ln1(x))[0].chunk(3, dim=-1))
        a = (torch.softmax(q @ k.transpose(-1, -2), -1) @ v).transpose(0, 1)  # [s, b, h/t]
        x = x + self.o(a)[0]
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))[0]))[0]


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    shape_args(p)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--clip-grad", type=float, default=1.0, help="OptimizerConfig's clip_grad")
    p.add_argument("--overlap-grad-reduce", action="store_true",
                   help="DistributedDataParallelConfig's overlap_grad_reduce: the buffer in buckets")
    p.add_argument("--bucket-size", type=int, default=None,
                   help="its bucket_size (elements; default: megatron-core's)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks: megatron-core's "
                   "column- and row-parallel linears in each layer (MegatronLayer)")
    p.add_argument("--sp", action="store_true", help="with --tp: sequence parallelism, the "
                   "gradients synchronised by finalize_model_grads")
    a = p.parse_args()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"
        torch.cuda.synchronize = lambda *_, **__: None
        OnCPU().__enter__()
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=a.tp)
    torch.manual_seed(0)
    config = TransformerConfig(num_layers=a.layers, hidden_size=a.hidden, num_attention_heads=4,
                               use_cpu_initialization=True, params_dtype=torch.float32,
                               tensor_model_parallel_size=a.tp, sequence_parallel=a.sp)
    layers = torch.nn.Sequential(*[
        MegatronLayer(a.hidden, a.ffn, config) if a.tp > 1 else Layer(a.hidden, a.ffn)
        for _ in range(a.layers)])
    model = DistributedDataParallel(config, DistributedDataParallelConfig(
        use_distributed_optimizer=True, grad_reduce_in_fp32=True,
        overlap_grad_reduce=a.overlap_grad_reduce, bucket_size=a.bucket_size), layers)
    opt = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=1e-3, use_distributed_optimizer=True, clip_grad=a.clip_grad,
        params_dtype=torch.float32), [model])
    for _ in range(a.steps):
        with step():
            model.zero_grad_buffer()
            opt.zero_grad()
            if a.tp > 1:  # Megatron's sequence-first activations, under SP this rank's part
                x = torch.randn(a.seq // a.tp if a.sp else a.seq, a.batch, a.hidden)
            else:
                x = torch.randn(a.batch, a.seq, a.hidden)
            model(x).sum().backward()
            if a.sp:  # the LayerNorms' gradients summed over TP, after the data-parallel sync
                finalize_model_grads([model])
            else:
                model.finish_grad_sync()
            opt.step()
    parallel_state.destroy_model_parallel()
