"""`gpu-placement replay`: a trace (Alibaba's openb CSVs, or your own cluster) through the real filter,
scores and bind bookkeeping, no cluster needed (docs/replay.md). It assembles the extender's pieces as a
live cluster runs them, so it sits above the edges and below the command line.

- trace.py      the trace's nodes and tasks, and their arrival order as the ATC'23 simulator draws it
- gorand.py     Go's math/rand, draw for draw, so seeds give the paper's task lists
- cluster.py    the replayed cluster as Kubernetes objects (Nodes, validators, DRA devices, claims)
- scheduler.py  kube-scheduler around the extender: its own filters and scores, how it picks the node
- simulate.py   one replay: each task arrives, is filtered, scored, bound and seen by the view
- report.py     the strategies side by side over the seeds asked: text or the contract's JSON
"""
