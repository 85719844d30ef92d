"""The GRPO trainer: generation servers, NeMo Gym environment servers, rollouts and the training loop."""
