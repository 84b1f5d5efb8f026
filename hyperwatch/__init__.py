"""HyperWatch: training-stability monitoring across model scales.

This small package holds only the command-line front door; the product lives in the
top-level packages ``trainer`` (bundled HyperP trainer), ``hooks`` (indicators and sinks),
``monitor`` (service) and ``web`` (dashboards).
"""

__version__ = "0.1.0"
