"""The job's cluster as the trainer meets it: connecting to Ray (a local head for `grpojob run`, the job's
RayCluster on Kubernetes) and the `<job>-endpoints` rendezvous every pod reads."""
