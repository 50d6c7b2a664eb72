"""What the Kubernetes API is made of, without I/O: API paths, watch queries, label and field
selectors, representations, kubeconfig rendering, forwarded headers. Reading credentials and
running exec plugins is I/O: that is ``watchproxy.upstream``'s."""
