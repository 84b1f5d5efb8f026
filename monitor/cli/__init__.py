"""The service's commands (``hyperwatch db``, ``runs``, ``forecast``, ``analyze``): each parses and
validates its flags, then drives the store, the read layer or the analysis fits. Registered in
``hyperwatch/cli.py``, which imports them lazily."""
