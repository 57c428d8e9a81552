"""Every decision: the placement rules (one place per reason code), what a pod requires, placement and
scores, preemption, kube-scheduler's own filters, claims and their quota, driver rollouts."""
