"""The GRPO algorithm's pure math: advantages and the policy loss (`grpo`), and the samples it trains on
(`samples`). No Ray, HTTP or Kubernetes."""
