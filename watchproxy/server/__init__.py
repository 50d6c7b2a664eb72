"""The client-facing edge: the listener (connection cap, header deadline), the API handlers,
pass-through, protocol-upgrade relay, and the admin port."""
