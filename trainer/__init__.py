"""HyperWatch trainer package."""
