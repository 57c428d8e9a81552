"""The Kubernetes API: client configuration and raw calls, the async client /bind uses, Leases, the
leader loop the controllers run on, owners, and discovery of resource.k8s.io."""
