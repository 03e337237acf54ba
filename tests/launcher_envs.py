"""What each launcher sets for every rank of a 2-node x 4-rank job, as data
(../shared/reference/nccl-and-traces.md: torchrun's, srun's, Open MPI's, MPICH's and Intel MPI's
Hydra, MVAPICH's variables). Ranks fill nodes in order (rank r on node r // 4, local rank r % 4).
"""

from __future__ import annotations

NODES, PER_NODE = 2, 4
SIZE = NODES * PER_NODE

_SLURM_STEP = {"SLURM_STEP_ID": "0", "SLURM_JOB_ID": "777", "SLURM_STEP_NUM_TASKS": str(SIZE),
               "SLURM_NTASKS": str(SIZE), "SLURM_STEP_NODELIST": "gpu[01-02]",
               "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_STEP_TASKS_PER_NODE": f"{PER_NODE}(x2)",
               "SLURM_TASKS_PER_NODE": f"{PER_NODE}(x2)"}


def _slurm(r: int) -> dict[str, str]:
    return {**_SLURM_STEP, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r % PER_NODE),
            "SLURM_NODEID": str(r // PER_NODE)}


def env_of(launcher: str, r: int) -> dict[str, str]:
    """Rank ``r``'s environment under ``launcher``."""
    node, local = divmod(r, PER_NODE)
    if launcher == "torchrun":
        return {"RANK": str(r), "WORLD_SIZE": str(SIZE), "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(PER_NODE), "GROUP_RANK": str(node),
                "MASTER_ADDR": "gpu01", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job"}
    if launcher == "srun":
        return _slurm(r)
    if launcher == "srun --mpi=pmi2":  # Slurm's pmi2 plugin: PMI_RANK/PMI_SIZE, no local rank
        return {**_slurm(r), "PMI_RANK": str(r), "PMI_SIZE": str(SIZE), "PMI_FD": "5",
                "PMI_JOBID": "777.0"}
    if launcher == "srun --mpi=pmix":  # PMIx namespace and rank; the size from Slurm
        return {**_slurm(r), "PMIX_RANK": str(r), "PMIX_NAMESPACE": "slurm.pmix.777.0",
                "PMIX_SERVER_URI2": "x"}
    if launcher == "mpirun (Open MPI)":
        return {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": str(SIZE),
                "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
                "OMPI_COMM_WORLD_LOCAL_SIZE": str(PER_NODE),
                "OMPI_COMM_WORLD_NODE_RANK": str(local), "PMIX_RANK": str(r)}
    if launcher == "mpiexec (MPICH, Intel MPI)":
        return {"PMI_RANK": str(r), "PMI_SIZE": str(SIZE), "MPI_LOCALRANKID": str(local),
                "MPI_LOCALNRANKS": str(PER_NODE), "PMI_FD": "6"}
    if launcher == "mpirun_rsh (MVAPICH)":
        return {"MV2_COMM_WORLD_RANK": str(r), "MV2_COMM_WORLD_SIZE": str(SIZE),
                "MV2_COMM_WORLD_LOCAL_RANK": str(local),
                "MV2_COMM_WORLD_LOCAL_SIZE": str(PER_NODE)}
    raise KeyError(launcher)


# launcher -> the name commbench.runtime.launch.detect gives it
LAUNCHERS = {"torchrun": "torchrun", "srun": "slurm", "srun --mpi=pmi2": "mpich",
             "srun --mpi=pmix": "pmix", "mpirun (Open MPI)": "openmpi",
             "mpiexec (MPICH, Intel MPI)": "mpich", "mpirun_rsh (MVAPICH)": "mvapich"}
