"""The world a rank is given: its context (rank, groups, comms, ledger), a local world of spawned
ranks, a launched world under mpirun, srun or torchrun."""
