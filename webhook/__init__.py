"""Admission webhook: shapes and admits pods by namespace GPU policy (docs/webhook.md).

One job per module: `review` (the AdmissionReview wire format), `patches` (the JSON Patch), `shaping`
and `audit` (what /validate holds a pod to, what audit mode tells), `quota` and `quota_gate` (what is
in use, holds that warn, the gate until the API server enforces), `holds` (settling holds by lists),
`dra_claims` and `dra_validate` (claims instead of GPU resources), `namespace_reader` and
`claim_reader` (objects the view has not seen yet), `admission` (the two decisions), `app` (the HTTP
edge, `create_app`). The webhook's own objects: `rotation` (certificates), `registration`. Namespace
policy, quantities and quoting are the core's (gpu_placement/facts, gpu_placement/base).
"""
