"""Networking shared by every layer (`http`): ports, health waits, our servers' HTTP plumbing."""
