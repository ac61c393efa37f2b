"""The delivery room: attempts, failover, breakers."""
