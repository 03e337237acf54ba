"""A pipeline stage's messages: when each send goes, with which receive, as one group call.

NCCL ignores tags and runs each communicator's calls in order, without buffering large
messages: two stages that each post a send to the other before their receive both wait. So a
stage holds its sends and posts them with receives as one group call (``Comm.start_exchange``),
in Megatron's two ways (Narayanan et al. 2021; Megatron-LM's p2p_communication):

* GPipe and 1F1B (``units=None``) send downstream in the forwards and upstream in the
  backwards: a held send goes with the next step's receive (``send_forward_recv_backward``), or
  alone when that step receives nothing, since the peer is then waiting for it.
* interleaved 1F1B sends both ways at once: the schedule is cut in units (each warm-up and
  cool-down step alone, a forward and a backward together in the steady state), and after each
  unit one group call holds its sends and the receives of the next unit
  (``send_forward_backward_recv_forward_backward``); a unit's receives are waited as it starts.

Either way the receives are booked as ``recv`` (a trace counts the wait as idle), the sends as
``isend``, waited at the end. Peers are positions in the pipeline group.
"""

from __future__ import annotations

import torch

from commbench.runtime.group import Group

__all__ = ["StageLink", "units"]


def units(kinds: list[str], warm: int) -> list[list[int]]:
    """Step indices of the interleaved schedule's units: ``warm`` warm-up steps alone, then
    (forward, backward) pairs while both alternate, then the cool-down steps alone."""
    out = [[k] for k in range(warm)]
    k = warm
    while k + 1 < len(kinds) and kinds[k] == "F" and kinds[k + 1] == "B":
        out.append([k, k + 1])
        k += 2
    return out + [[i] for i in range(k, len(kinds))]


class StageLink:
    """One rank's sends and receives over ``group`` (module docstring). ``sources[k]``: the
    position step k receives from (this rank's own: nothing from the wire)."""

    def __init__(self, comm, group: Group, probe: torch.Tensor, tag: int,
                 sources: list[int], steps_of_units: list[list[int]] | None) -> None:
        self.comm, self.group, self.probe, self.tag = comm, group, probe, tag
        self.sources, self.me = sources, group.index
        self.units = steps_of_units
        self.unit_of = {k: u for u, ks in enumerate(steps_of_units or []) for k in ks}
        self.held: list[tuple[torch.Tensor, int]] = []
        self.posted: list = []  # every exchange, waited at the end for its sends
        self.pending: dict[int, tuple] = {}  # unit -> (exchange, its steps that receive)
        self.got: dict[int, torch.Tensor] = {}
        if self.units:
            self._post(0)

    def send(self, t: torch.Tensor, dst: int) -> None:
        self.held.append((t.contiguous(), dst))

    def _wire(self, steps: list[int]) -> list[int]:
        return [k for k in steps if self.sources[k] != self.me]

    def _exchange(self, steps: list[int]):
        """The held sends and ``steps``' receives as one group call (none at all: nothing)."""
        if not steps and not self.held:
            return None
        ex = self.comm.start_exchange(list(self.held), [(self.probe, self.sources[k])
                                                        for k in steps], self.group,
                                      tag=self.tag, recv_op="recv")
        self.held.clear()
        self.posted.append(ex)
        return ex

    def _post(self, u: int) -> None:
        """The held sends with unit ``u``'s receives (none past the last unit)."""
        steps = self._wire(self.units[u]) if u < len(self.units) else []
        ex = self._exchange(steps)
        if steps:
            self.pending[u] = (ex, steps)

    def before(self, k: int) -> None:
        """Step ``k`` starts: GPipe/1F1B send what is held when it receives nothing."""
        if self.units is None and self.sources[k] == self.me:
            self._exchange([])

    def after(self, k: int) -> None:
        """Step ``k`` ended: interleaved, at a unit's last step, post with the next unit."""
        if self.units is not None:
            u = self.unit_of[k]
            if k == self.units[u][-1]:
                self._post(u + 1)

    def recv(self, k: int) -> torch.Tensor:
        """Step ``k``'s input from the wire."""
        if self.units is None:
            return self._exchange([k]).received()[0]
        u = self.unit_of[k]
        if u in self.pending:
            ex, steps = self.pending.pop(u)
            self.got.update(zip(steps, ex.received()))
        return self.got.pop(k)

    def finish(self) -> None:
        self._exchange([])
        for ex in self.posted:
            ex.wait()
