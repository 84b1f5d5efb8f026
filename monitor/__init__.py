"""The monitoring service: ingest, store, alert, read. One folder per concept; the map, and the way
imports point between the folders, is monitor/README.md."""
