"""HyperWatch monitor package."""
