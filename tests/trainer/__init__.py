"""Tests that start real servers and processes for the trainer data plane."""
