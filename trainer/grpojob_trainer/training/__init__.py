"""Training: the step loop (`loop`), evaluation while training, the prompts a run reads and their sources, and
the placement of the engines and the policy's ranks on Ray. Above the policy, the generation engines and the
rollouts it drives."""
