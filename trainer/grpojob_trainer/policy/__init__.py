"""The policy: its training step, batches and log-probabilities, packing, ranks (FSDP2), the Ray worker and the
driver's handle on it, checkpoints and the exported Hugging Face model."""
