"""Kubernetes objects as the GPU Operator and NVIDIA's DRA driver publish them, built from real label
sets: the demo cluster, tests, benchmarks and the e2e harness."""
