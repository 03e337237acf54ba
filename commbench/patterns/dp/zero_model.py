"""The model, data, optimizer and oracle of the ZeRO patterns (their config: dp/configs.py).

A stack of L layers y = tanh(x W^T + b), W [h, h], b [h]; loss = 1/2 * sum((y_L - t)^2) over the
batch. Each optimizer step sums the gradients of ``micro`` micro-batches, then takes one Adam step
(Kingma and Ba 2015, no weight decay). The oracle trains the unsharded model in one process.

Every parameter of a layer lives in one flat vector [W.flatten(), b] of h*h + h elements, padded
to a multiple of the DP size P: rank r owns elements [r*c, (r+1)*c), c = padded / P, so a layer
with fewer elements than ranks leaves some ranks only padding (shape (c,), all zeros).
"""

from __future__ import annotations

import torch

from commbench.patterns.dp.configs import ZeroConfig

__all__ = ["Adam", "batch", "init_layers", "oracle_train"]

def init_layers(cfg: ZeroConfig, seed: int) -> list[torch.Tensor]:
    """Each layer's flat parameter vector, float64."""
    g = torch.Generator().manual_seed(seed)
    h = cfg.hidden
    return [torch.cat([torch.randn(h * h, generator=g, dtype=torch.float64) * h ** -0.5,
                       torch.randn(h, generator=g, dtype=torch.float64) * 0.1])
            for _ in range(cfg.layers)]


def batch(cfg: ZeroConfig, seed: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets [batch, h] of one micro-batch, float64."""
    g = torch.Generator().manual_seed(seed * 100003 + step * 101 + micro + 1)
    return (torch.randn(cfg.batch, cfg.hidden, generator=g, dtype=torch.float64),
            torch.randn(cfg.batch, cfg.hidden, generator=g, dtype=torch.float64))


def forward(flat: list[torch.Tensor], x: torch.Tensor, h: int) -> torch.Tensor:
    for f in flat:
        x = torch.tanh(x @ f[: h * h].view(h, h).T + f[h * h: h * h + h])
    return x


class Adam:
    """Adam on a list of fp32/fp64 tensors (the master weights or their shards)."""

    def __init__(self, params: list[torch.Tensor], lr: float, betas=(0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads: list[torch.Tensor]) -> None:
        self.t += 1
        b1, b2 = self.betas
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            g = g.to(p.dtype)
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            mhat = m / (1 - b1 ** self.t)
            vhat = v / (1 - b2 ** self.t)
            p.sub_(self.lr * mhat / (vhat.sqrt() + self.eps))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.m, *self.v))


def oracle_train(cfg: ZeroConfig, seed: int, dtype: torch.dtype = torch.float64,
                 slices: int = 1, reverse: bool = False) -> list[torch.Tensor]:
    """Each layer's flat parameters after ``cfg.steps`` steps, trained unsharded in one process.

    dtype float64 is the truth. In lower precision the result depends on where the batch is cut:
    with ``slices`` = P, each of P batch slices is computed on its own in ``dtype`` and the
    gradients summed in float32 (float64 for float64), as P data-parallel ranks do with fp32
    gradient reduction; only the order of that sum differs from a distributed run.
    ``reverse`` sums the micro-batches and slices in the opposite order: the spread between the
    two runs is how much the order of the sum alone moves the result.
    """
    master_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    master = [f.to(master_dtype) for f in init_layers(cfg, seed)]
    opt = Adam(master, cfg.lr)
    for step in range(cfg.steps):
        grads = [torch.zeros_like(f) for f in master]
        for mb in (reversed if reverse else iter)(range(cfg.micro)):
            xs, ts = batch(cfg, seed, step, mb)
            pairs = list(zip(xs.chunk(slices), ts.chunk(slices)))
            for x, t in reversed(pairs) if reverse else pairs:
                params = [f.to(dtype, copy=True).requires_grad_() for f in master]
                y = forward(params, x.to(dtype), cfg.hidden)
                (0.5 * ((y - t.to(dtype)) ** 2).sum()).backward()
                for g, p in zip(grads, params):
                    g.add_(p.grad.to(master_dtype))
        opt.step(grads)
    return [f.double() for f in master]
