"""NeMo Gym's protocol: its rows and `/run` results, Responses↔Chat conversion, and its error bodies."""
