"""Kubernetes' own API e2e specs in a program of ours, and the conformance tier's lists."""
