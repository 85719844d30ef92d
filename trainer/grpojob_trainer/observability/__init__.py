"""What a run reports: step metrics and their sinks (JSONL, Prometheus, tracking services), the progress the
operator reads, and the run report."""
