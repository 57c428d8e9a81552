"""What the service keeps in the cluster, each loop under its own Lease: the ResourceQuota mirror, the
ResourceClaimTemplates of `dra` namespaces, DeviceTaintRules, Events."""
