"""Where a watched call comes from, read off the library's own stack: the phase a library gives a
call it makes outside the autograd engine (DeepSpeed's reductions, pipelining's batches, an
optimizer's step) and the module whose parameters a call carries (FSDP2's groups, ZeRO-3's
lists), by hand on frames shaped as the libraries' and on the world."""

from __future__ import annotations

import sys

import pytest
import torch

from commbench.wire.watch import watch

pytestmark = pytest.mark.foundation


def _zero_redundancy(ctx):
    """torch's ZeroRedundancyOptimizer: DDP's all-reduce of the gradient in backward, then in
    its step each rank's updated shard broadcast from its owner."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(*(torch.nn.Linear(4, 4)
                                                          for _ in range(ctx.size))))
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    with watch(ctx.ledger), ctx.ledger.capture() as cap:
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    return [(e.op, e.phase) for e in cap.entries]


@pytest.mark.world(sizes=[2, 4])
def test_an_optimizer_s_step_is_a_phase_of_its_own(world):
    for got in world.run(_zero_redundancy):
        assert got[0] == ("all_reduce", "backward"), got
        assert set(got[1:]) == {("broadcast", "optimizer")} and len(got) - 1 >= world.size, got


def test_the_phase_a_library_gives_a_call_outside_the_engine():
    """The innermost frame that says decides: DeepSpeed reduces gradients after backward
    returns, inside its engine's ``backward``; Megatron's ``forward_backward_no_pipelining``
    says both and decides nothing, its ``forward_step`` inside it says forward; a pipelining
    batch says per op."""
    import sys

    from commbench.wire.modules import library_phase

    def here(op=""):
        return library_phase(sys._getframe(1), op)

    def allreduce_gradients():
        return here()

    def backward():  # DeepSpeedEngine.backward
        return allreduce_gradients()

    def forward_step():
        return here()

    def forward_backward_no_pipelining(step):
        return step()

    def _batch_p2p(ops, desc=None):
        return [here(op) for op in ops]

    class ZeROOptimizer:  # DeepSpeed's base: no torch Optimizer
        def step(self):
            return self.get_grad_norm_direct()

        def get_grad_norm_direct(self):
            return here()

    class Stage(ZeROOptimizer):
        def reduce_gradients(self):
            return here()

        def step(self):  # a gradient reduction inside the step is still backward
            return super().step(), self.reduce_gradients()

    class Schedule:  # a step that is no optimizer's decides nothing
        def step(self):
            return here()

    assert backward() == "backward" and allreduce_gradients() == "backward"
    assert forward_backward_no_pipelining(forward_step) == "forward"
    assert forward_backward_no_pipelining(here) == ""
    assert _batch_p2p(["isend", "irecv"], desc="fwd_send_bwd_recv") == ["forward", "backward"]
    assert _batch_p2p(["isend", "irecv"], desc="bwd_send_fwd_recv") == ["backward", "forward"]
    assert _batch_p2p(["irecv"], desc="bwd_recv") == ["backward"]
    assert _batch_p2p(["isend"], desc=None) == [""]
    assert _batch_p2p(["send", "recv"], desc="fwd_recv") == ["forward", "forward"]  # one way
    assert _batch_p2p(["all_reduce"], desc="fwd_send_bwd_recv") == [""]  # neither kind
    assert ZeROOptimizer().step() == "optimizer" and Schedule().step() == ""
    assert Stage().step() == ("optimizer", "backward")
    assert ZeROOptimizer().get_grad_norm_direct() == ""  # an optimizer's method, not its step
    assert _batch_p2p(["send", "recv"], desc="fwd_send_bwd_recv") == ["forward", "backward"]

    def neither(depth):  # depth bounds the walk
        return library_phase(sys._getframe(), depth=depth)

    def grads_reduced(depth):
        return neither(depth)

    assert grads_reduced(1) == "" and grads_reduced(2) == "backward"

    class Wrapper:  # DDP: its constructor broadcasts the parameters
        def __init__(self):
            self.said = self._sync_module_states()

        def _sync_module_states(self):
            return here()

    def initialize_model_parallel():  # Megatron's groups
        return here()

    def distribute_tensor():  # torch TP placing a weight
        return here()

    def redistribute():  # DTensor moving an activation in forward: no set-up word
        return here()

    assert Wrapper().said == initialize_model_parallel() == distribute_tensor() == "setup"
    assert redistribute() == "" and forward_backward_no_pipelining(Wrapper).said == "setup"

    class DistributedOptimizer:  # megatron-core's: the parameter gather inside the step
        def step(self):
            return self.step_with_ready_grads(), self.get_grad_norm_fp32()

        def step_with_ready_grads(self):
            return self._copy_main_params_to_model_params()

        def _copy_main_params_to_model_params(self):
            return here("all_gather")

        def get_grad_norm_fp32(self):
            return here("all_reduce")

    def finish_grad_sync():  # megatron-core's DDP: the gradient reduce-scatter
        return here("reduce_scatter")

    def clip_grad_norm_():  # torch's, called by a script outside any step
        return here("all_reduce")

    assert DistributedOptimizer().step() == ("optimizer", "optimizer")
    assert finish_grad_sync() == "backward" and clip_grad_norm_() == ""
    assert DistributedOptimizer().step_with_ready_grads() == "optimizer"
    assert _batch_p2p(["isend"], desc="FWD_SEND") == [""]  # torch's labels are lower case


def test_the_module_a_zero_3_call_carries_by_hand():
    """A DeepSpeed frame naming its parameters (ZeRO-3's gather of ``params``, its reduction of
    ``params_to_reduce``): the innermost module holding all of them, a prefetched layer's
    gather under that layer wherever the tracker stands; no ``ds_id``, no DeepSpeed frame or
    no known owner: nothing said."""
    from commbench.wire.modules import holder, library_module

    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)),
                                torch.nn.Linear(2, 2))
    known = {m: "Sequential" + (f".{n}" if n else "") for n, m in model.named_modules()}
    inner, first, second, last = model[0], model[0][0], model[0][1], model[1]
    assert holder([first.weight], known) == "Sequential.0.0"
    assert holder([first.weight, second.bias], known) == "Sequential.0"
    assert holder(list(model.parameters()), known) == "Sequential"
    assert holder([torch.nn.Parameter(torch.ones(1))], known) == ""
    assert holder([inner[0].weight, last.weight], {first: "A.b.c", last: "A.bc"}) == "A"
    for p in model.parameters():
        p.ds_id = 0
    code = compile("def all_gather_coalesced(params):\n    return look(sys._getframe())\n",
                   "site-packages/deepspeed/runtime/zero/partition_parameters.py", "exec")
    scope = {"sys": __import__("sys"), "look": lambda f: library_module(f, known)}
    exec(code, scope)
    gather = scope["all_gather_coalesced"]
    assert gather([second.weight, second.bias]) == "Sequential.0.1"
    assert gather(p for p in [last.weight]) == ""  # not a list: no record
    assert gather([]) == "" and gather([torch.ones(1)]) == ""  # no ds_id
    here = sys._getframe()
    assert library_module(here, known) == ""  # not DeepSpeed's frame
    assert holder([first.weight, last.weight], {first: "A.x", last: "B.x"}) == ""
    # the innermost frame that names parameters with a ds_id decides, past one that does not
    outer = compile("def __avg_scatter_grads(params_to_reduce, inner):\n"
                    "    return inner([torch.ones(1)], sys._getframe())\n",
                    "site-packages/deepspeed/runtime/zero/stage3.py", "exec")
    scope["torch"] = torch
    exec(outer, scope)
    inner = compile("def reduce_scatter_coalesced(params, frame):\n"
                    "    return look(sys._getframe()), library_module(sys._getframe(), known, 1)\n",
                    "site-packages/deepspeed/runtime/comm/coalesced_collectives.py", "exec")
    scope.update(library_module=library_module, known=known)
    exec(inner, scope)
    assert scope["__avg_scatter_grads"]([first.weight, second.weight],
                                        scope["reduce_scatter_coalesced"]) == ("Sequential.0", "")
    # FSDP2: a parameter group's first module, wherever the tracker stands
    fsdp = compile("class FSDPParamGroup:\n"
                   "    def __init__(self, modules):\n        self.modules = modules\n"
                   "    def post_backward(self):\n        return look(sys._getframe())\n"
                   "class Other(FSDPParamGroup):\n    pass\n",
                   "site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "exec")
    exec(fsdp, scope)
    group, other = scope["FSDPParamGroup"], scope["Other"]
    assert group([second, first]).post_backward() == "Sequential.0.1"
    assert group([]).post_backward() == "" and other([first]).post_backward() == ""
    assert group([torch.nn.Linear(1, 1)]).post_backward() == ""  # a module not known
