"""HyperWatch: training-stability monitoring across model scales.

One import namespace: ``hyperwatch.hooks`` (indicators and sinks; needs only torch and numpy),
``hyperwatch.monitor`` (service), ``hyperwatch.web`` (dashboards) and ``hyperwatch.trainer``
(bundled HyperP trainer). In the repository these are the top-level folders, linked here.
Importing ``hyperwatch`` itself imports nothing else.
"""

__version__ = "0.1.0"
