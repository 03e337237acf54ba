"""Transports behind :class:`commbench.comm.Comm`: torch.distributed (gloo, NCCL) and mpi4py.

Each backend takes tensors that the comm layer has already checked and made contiguous, writes
results into the buffers it is given, and names dtype/op pairs it cannot do (``unsupported``).
"""
