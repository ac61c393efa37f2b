"""The store room: the region's Redis."""
