"""Real client programs (client-go, ...) that the end-to-end tests run through watchproxy."""
