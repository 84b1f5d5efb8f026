"""Sinks: memory (tests), JSONL folder (offline), HTTP with an on-disk spool; fanned out."""

from __future__ import annotations

from hyperwatch.hooks.sinks.base import RUN_FIELDS, FanOut, MemorySink, RunInfo, Sink, SinkError
from hyperwatch.hooks.sinks.http import HttpSink
from hyperwatch.hooks.sinks.jsonl import JsonlSink

__all__ = ["RUN_FIELDS", "FanOut", "HttpSink", "JsonlSink", "MemorySink", "RunInfo", "Sink", "SinkError"]
