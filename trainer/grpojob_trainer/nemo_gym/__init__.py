"""NeMo Gym protocol: rows, Responses↔Chat conversion, rollout collection into TrainingSamples."""
