"""The survey of a GPU cluster (`gpu-placement survey`) and the migration of one node to the GPU Operator
(`gpu-placement migrate NODE`): docs/survey.md.

- labels.py     who wrote each GPU label, from the Node's managedFields
- inventory.py  the facts per GPU node (management, MIG, sharing, allocation) and the fleet per pool and product
- workloads.py  the GPU workloads, one per controller, named NS/KIND/NAME
- findings.py   the findings, one function per stable code
- run.py        one survey of a cluster's objects; report.py and page.py render it (text, Markdown, JSON, HTML)
- migrate.py    a node's migration steps, each one's state read from the cluster; migrate_command.py runs them
- live.py       one-shot reads and writes of a live cluster for both commands
"""
