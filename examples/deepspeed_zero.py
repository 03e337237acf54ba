"""DeepSpeed's ZeRO, stage 1, 2 or 3, on the transformer-shaped layers of examples/layers.py:
``deepspeed.initialize`` on the CPU accelerator over gloo, SGD, fp32, ``--steps`` steps of one
micro-batch, each marked for the audit's ``--step``.

    DS_BUILD_OPS=0 pip install 'commbench[libs]'
    DS_ACCELERATOR=cpu commbench audit examples/deepspeed_zero.py --np 2 -- --stage 2
    DS_ACCELERATOR=cpu commbench audit examples/deepspeed_zero.py --np 2 --step 3 \\
        --layout impl=deepspeed,zero=2,dp=2,layers=2,hidden=16,heads=4,ffn=64,seq=8,\\
micro-batch=2,micro-batches=1,loss=none -- --stage 2 --steps 3

From the third step on (the first two trace ZeRO-3's parameter order) it makes the calls of the
layout's ``impl=deepspeed`` (docs/audit.md).
"""

import argparse
import json

import torch
import torch.distributed as dist
from layers import Layer, shape_args  # examples/layers.py

try:
    import commbench

    step = commbench.audit.step  # marks the step for commbench audit --step
except ImportError:  # without commbench
    from contextlib import nullcontext as step

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=1, choices=(1, 2, 3))
    shape_args(p)
    p.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--config", default=None,
                   help="a ds_config JSON whose zero_optimization settings are laid over these")
    p.add_argument("--extra", action="store_true", help="one all-reduce no layout makes")
    a = p.parse_args()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Layer(a.hidden, a.ffn) for _ in range(a.layers)])
    config = {"train_micro_batch_size_per_gpu": a.batch,
              "gradient_accumulation_steps": a.micro_batches,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "zero_allow_untested_optimizer": True, "steps_per_print": 1 << 30,
              # every parameter sharded, as in a model of real size (the default keeps those
              # under 100,000 elements whole: every one of this model's)
              "zero_optimization": {"stage": a.stage, "stage3_param_persistence_threshold": 0}}
    if a.config:
        with open(a.config) as f:
            config["zero_optimization"] |= json.load(f).get("zero_optimization", {})
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    for _ in range(a.steps):
        with step():
            for _ in range(a.micro_batches):
                loss = engine(torch.randn(a.batch, a.seq, a.hidden)).sum()
                engine.backward(loss)
                engine.step()  # steps the optimizer at the last micro-batch
            if a.extra:
                dist.all_reduce(torch.ones(8))
