"""The local world: ranks spawned and kept by this process when no launcher started it."""

from commbench.world.local.world import LocalWorld, find_mpiexec

__all__ = ["LocalWorld", "find_mpiexec"]
