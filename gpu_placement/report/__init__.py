"""What people read: the `nodes` and `namespaces` tables, the rollout report, DRA device rows, the
cluster's metrics as gpu-placement sees it, the chart's alerts evaluated."""
