"""gpu-placement: GPU placement for Kubernetes clusters that run the NVIDIA GPU Operator.

One folder per layer, each importing only the ones below it (docs/architecture.md, checked by
`lint-imports`): base < facts < observe, samples < kube, web < view < decide < controllers < report <
survey, outcomes (beside extender/ and webhook/) < app.
"""
