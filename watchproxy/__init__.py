"""watchproxy: a sidecar proxy for the Kubernetes API that shares identical watches."""

__version__ = "0.2.0"
