"""What the Kubernetes API is made of, without I/O: API paths, watch queries, label and field
selectors, representations, kubeconfig and credentials, forwarded headers."""
