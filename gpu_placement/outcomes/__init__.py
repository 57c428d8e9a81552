"""Launch outcomes and node lifecycle times (`gpu-placement report`, docs/outcomes.md).

- record.py   what the view's events say happened to each bound GPU pod and each GPU node, and when
- counter.py  the holder of the outcomes Lease counts them once for the cluster (totals in the Lease)
- idle.py     free GPUs on verified nodes while GPU pods wait, by why they wait
- report.py   the before/after table from Prometheus; demo.py the same table for `make demo`
"""
