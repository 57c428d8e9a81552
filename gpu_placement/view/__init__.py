"""The in-memory view of the cluster both edges read, and what feeds it: ingest, list+watch, snapshot
files, one-shot fetches, DCGM telemetry, and the DRA state."""
