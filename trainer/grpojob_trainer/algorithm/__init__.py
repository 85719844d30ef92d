"""The GRPO algorithm: the step loop (`loop`), its math (`grpo`), the samples it trains on and the prompts it reads."""
