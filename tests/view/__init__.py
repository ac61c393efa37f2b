"""The view room: memory kept current."""
