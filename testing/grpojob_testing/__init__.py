"""A real Kubernetes control plane for tests, built from pinned sources and run on loopback."""
