"""Dynamic Resource Allocation (docs/dra.md): GPUs claimed through ResourceClaims.

Layers, bottom up: `objects` (slim records parsed from resource.k8s.io JSON), `discovery` (which
version of the API serves what), `state` (the view's DRA part: devices per node, classes, claims),
`devices` (what people read: devices per node, what a pod's claims could take), `taints` (the
leader-elected DeviceTaintRule writer). Everything here is off when the API server does not serve
resource.k8s.io.
"""
