"""NeMo Gym (Penguin) protocol: rows, Responses↔Chat conversion, rollout collection into TrainingSamples."""
