"""Shared watches: one upstream LIST+WATCH per key, its state and history, and the fan-out to
every subscribed client."""
