"""Service-wide configuration and domain errors."""
