"""Records parsed once from Kubernetes objects (nodes, pods, namespaces and their policy, DRA devices and
claims, soak state, launch outcomes): pure functions of what the cluster stores, no I/O."""
