"""Which module a call comes from: torch's module tracker, made safe for every way of taking a
gradient (the watcher's ``module`` column, :mod:`commbench.wire.watch`)."""

from __future__ import annotations

import torch

__all__ = ["module_tracker"]


def module_tracker():
    """torch's ``ModuleTracker``, made safe for ``torch.autograd.grad``: the tracker waits for
    every input's gradient of a module (a multi-grad hook in mode "all", which asks the engine
    whether it will reach each input, and the engine refuses for a leaf under
    ``autograd.grad``: the script crashed). Where a module's inputs include a leaf, its hook
    fires on the first input gradient instead (mode "any"); the module stack is the same."""
    from torch.autograd.graph import register_multi_grad_hook
    from torch.utils._pytree import tree_flatten
    from torch.utils.module_tracker import ModuleTracker

    class Tracker(ModuleTracker):
        def _fw_pre_hook(self, mod, input) -> None:
            name = self._get_mod_name(mod)
            self._get_append_fn(name, False)()
            args, _ = tree_flatten(input)
            tensors = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            if tensors:
                mode = "any" if any(t.grad_fn is None for t in tensors) else "all"
                self._hooks.append(register_multi_grad_hook(
                    tensors, self._get_pop_fn(name, True), mode=mode))

    private = ("_get_mod_name", "_get_append_fn", "_get_pop_fn", "_fw_pre_hook")
    return Tracker() if all(hasattr(ModuleTracker, p) for p in private) else ModuleTracker()
