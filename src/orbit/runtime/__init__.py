"""The runtime wrapper that travels inside every bundle (scripts/). Standard library only."""
