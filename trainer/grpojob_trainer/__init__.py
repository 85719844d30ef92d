"""The GRPO trainer: generation servers, Penguin environment servers, rollouts and the training loop."""
