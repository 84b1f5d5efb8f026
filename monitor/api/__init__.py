"""HTTP layer: dependencies, middleware and the routes under /api/v1."""
