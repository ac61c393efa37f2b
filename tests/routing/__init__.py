"""The routing room."""
