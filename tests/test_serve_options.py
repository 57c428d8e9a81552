"""`serve`'s options (gpu_placement/app/serve_options.py): built once from the command line, each default
written once."""

from __future__ import annotations

import pytest

from gpu_placement.app.cli import build_parser
from gpu_placement.app.serve_options import ServeOptions


def test_every_flag_defaults_to_the_options_default() -> None:
    """Every field is one of serve's flags (from_args reads each), and every flag left out is the field's
    default: the parser has no default of its own."""
    assert ServeOptions.from_args(build_parser().parse_args(["serve"])) == ServeOptions()


def test_flags_given_are_typed_options() -> None:
    args = build_parser().parse_args(["serve", "--components", "webhook", "--webhook-listen", "127.0.0.1:9443",
                                      "--ca-overlap", "5m", "--no-quota-mirror", "--dra-lease", "mine"])
    options = ServeOptions.from_args(args)
    assert options == ServeOptions(components=("webhook",), webhook_listen=("127.0.0.1", 9443), ca_overlap=300.0,
                                   quota_mirror=False, dra_lease="mine")


def test_the_rotation_defaults_are_the_certificate_managers() -> None:
    from webhook.rotation import RotationSettings

    assert RotationSettings.from_args(ServeOptions()) == RotationSettings()


def test_the_lease_names_are_the_loops_own() -> None:
    """The loops' settings keep a Lease name of their own for when they are built without serve (tests,
    tools); serve's flags name the same Leases."""
    from gpu_placement.controllers.dra_taints import TaintSettings
    from gpu_placement.controllers.launch_fences import FenceSettings
    from gpu_placement.controllers.quota_mirror import MirrorSettings
    from gpu_placement.controllers.settled_drivers import SettledSettings
    from gpu_placement.outcomes.counter import CounterSettings

    options = ServeOptions()
    assert (options.quota_lease, options.dra_lease, options.drivers_lease, options.outcomes_lease,
            options.fences_lease) == (MirrorSettings().lease_name, TaintSettings().lease_name,
                                      SettledSettings().lease_name, CounterSettings().lease_name,
                                      FenceSettings().lease_name)


@pytest.mark.parametrize(("namespace", "pod_namespace", "home"), [
    ("given", "pods", "given"), (None, "pods", "pods"), (None, None, "gpu-placement")])
def test_home_is_the_flag_else_the_pods_namespace(namespace: str | None, pod_namespace: str | None, home: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    if pod_namespace is None:
        monkeypatch.delenv("POD_NAMESPACE", raising=False)
    else:
        monkeypatch.setenv("POD_NAMESPACE", pod_namespace)
    assert ServeOptions(namespace=namespace).home == home
