"""HyperWatch web package."""
