"""The GRPOJob API (grpo.dev/v1alpha1): pydantic models shared by the operator, the CRD and the trainer."""
