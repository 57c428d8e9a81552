"""Every Prometheus metric the process exports, declared in one place, and the log format."""
