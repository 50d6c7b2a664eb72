"""Pure policies, each a value in and a value out: reconnect back-off, rate limits, access rules."""
