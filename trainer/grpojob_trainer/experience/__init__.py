"""Experience: rollouts collected through the environments' NeMo Gym protocol, turned into `TrainingSample`s,
with their metrics."""
