"""What several test files share: builders of nodes, pods and clusters, the apps served over HTTP(S),
clients, fake-API helpers and `wait_for`. Test modules import from here (or from the helper modules
beside them in tests/: fakeapi, prometheus, hostile, ...), never from another test_*.py module
(tests/test_suite_rules.py): editing one test file then breaks no other."""
