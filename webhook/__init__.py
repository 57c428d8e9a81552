"""Admission webhook: shapes and admits pods by namespace GPU policy (docs/webhook.md).

One job per module: `review` (the AdmissionReview wire format), `policy` (namespace and pod
annotations), `patches` (the JSON Patch), `quota` (usage and reservations), `admission` (the two
decisions), `app` (the HTTP edge, `create_app`). `text` and `quantities` make untrusted text safe to
quote and to parse. Certificates and the TLS listener: `certs`, `tls`, `rotation`.
"""
