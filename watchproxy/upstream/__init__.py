"""The one way out to the apiserver: its address and credentials (token files, kubeconfigs,
exec plugins), connection dialing, the authenticated client with its rate limiter, and the
connectivity prober that decides when the upstream is down."""
