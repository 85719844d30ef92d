"""Moving the policy's weights to the generation engines: the tensor buckets, CUDA IPC and NCCL ends (`buckets`)
and the path the driver picks for a run (`paths`: object store, CUDA IPC or NCCL broadcast)."""
