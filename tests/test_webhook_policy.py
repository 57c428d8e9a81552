"""gpu_placement/facts/policy.py: namespace annotations into a policy, one sentence per bad annotation, parsed
once per namespace change; then the same sentences as a user sees them over HTTPS."""

from __future__ import annotations

import time

import pytest

from gpu_placement.base.config import parse_config
from gpu_placement.facts.namespaces import NamespaceRecord
from gpu_placement.facts.policy import (
    NamespacePolicy,
    PolicyCache,
    Sharing,
    parse_policy,
    parse_sharing,
    pod_annotation_problems,
)
from gpu_placement.samples.cluster import namespace
from tests.support.webhook import TEST_CONFIG, Webhook, user_pod

pytestmark = pytest.mark.timeout(30)

CONFIG = parse_config(TEST_CONFIG)
ALLOW = parse_config({**TEST_CONFIG, "defaultNamespacePolicy": "allow"})


def policy(annotations: dict[str, str], name: str = "team-a") -> NamespacePolicy:
    return parse_policy(NamespaceRecord(name, annotations, "1"), name, CONFIG)


def only_error(annotations: dict[str, str]) -> str:
    errors = policy(annotations).errors
    assert len(errors) == 1, errors
    return next(iter(errors.values()))


# -- parsing -----------------------------------------------------------------------------------------

def test_no_annotations_means_exclusive_and_the_default_policy_decides_access() -> None:
    plain = parse_policy(None, "web", CONFIG)
    assert plain.sharing == Sharing("exclusive") and plain.quota is None and plain.pools == ()
    assert plain.errors == {} and plain.warnings == ()
    assert plain.entitled(CONFIG) is False  # deny
    assert parse_policy(None, "web", ALLOW).entitled(ALLOW) is True


def test_every_annotation_parses() -> None:
    parsed = policy({"gpu-placement.io/sharing": "shared", "gpu-placement.io/quota": " nvidia.com/gpu.shared=16 , ",
                     "gpu-placement.io/pools": "training, inference,training", "gpu-placement.io/gpu-memory": "20Gi",
                     "gpu-placement.io/gpu-products": "NVIDIA-H100-80GB-HBM3,NVIDIA-A100-SXM4-80GB",
                     "gpu-placement.io/cuda": "12.4"})
    assert parsed.errors == {}
    assert parsed.sharing.text == "shared" and parsed.sharing.resource(CONFIG) == "nvidia.com/gpu.shared"
    assert dict(parsed.quota or {}) == {"nvidia.com/gpu.shared": 16}
    assert parsed.pools == ("training", "inference")
    assert parsed.gpu_memory == "20Gi" and parsed.gpu_memory_mib == 20480
    assert parsed.products == {"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"}
    assert parsed.cuda == (12, 4)
    assert parsed.entitled(CONFIG)


def test_quota_takes_quantities_and_zero() -> None:
    parsed = policy({"gpu-placement.io/quota": "nvidia.com/gpu=2k,nvidia.com/mig-1g.10gb=0"})
    assert dict(parsed.quota or {}) == {"nvidia.com/gpu": 2000, "nvidia.com/mig-1g.10gb": 0}


def test_mig_sharing() -> None:
    parsed = policy({"gpu-placement.io/sharing": "mig-1g.10gb"})
    assert parsed.sharing == Sharing("mig", "1g.10gb")
    assert parsed.sharing.resource(CONFIG) == "nvidia.com/mig-1g.10gb"


def test_the_quota_message_of_the_contract() -> None:
    assert only_error({"gpu-placement.io/quota": "nvidia.com/gpu=lots"}) == (
        'gpu-placement.io/quota="nvidia.com/gpu=lots" on namespace team-a: "lots" is not a quantity; '
        "write it as nvidia.com/gpu=4,nvidia.com/gpu.shared=16")


@pytest.mark.parametrize(("annotations", "phrase"), [
    ({"gpu-placement.io/quota": "nvidia.com/gpu=４"}, "U+FF14 FULLWIDTH DIGIT FOUR at position 16"),
    ({"gpu-placement.io/quota": "nvidia.com/gpu=4\u200f"}, 'nvidia.com/gpu=4\\u200f" on namespace team-a: it contains '
                                                          "U+200F RIGHT-TO-LEFT MARK"),
    ({"gpu-placement.io/quota": "nvidia.com/gpu=\U0001f680"}, "U+1F680 ROCKET"),
    ({"gpu-placement.io/quota": "cpu=4"}, '"cpu" is not a GPU resource'),
    ({"gpu-placement.io/quota": "nvidia.com/gpu=1,nvidia.com/gpu=2"}, "nvidia.com/gpu is listed twice"),
    ({"gpu-placement.io/quota": "nvidia.com/gpu=1.5"}, '"1.5" is not a whole number of devices'),
    ({"gpu-placement.io/quota": "nvidia.com/gpu=-1"}, '"-1" is negative'),
    ({"gpu-placement.io/quota": "nvidia.com/gpu"}, '"nvidia.com/gpu" is not resource=count'),
    ({"gpu-placement.io/quota": " , "}, "it lists no resource"),
    ({"gpu-placement.io/quota": "nvidia.com/gpu=1e999999999"}, '"1e999999999" is not a quantity'),
    ({"gpu-placement.io/sharing": "Shared"}, "(values are lower case: shared)"),
    ({"gpu-placement.io/sharing": "mig-huge"}, '"huge" is not a MIG profile like 1g.10gb'),
    ({"gpu-placement.io/sharing": "mig-1g.10gb+me"}, "(the device plugin advertises 1g.10gb+me as mig-1g.10gb.me)"),
    ({"gpu-placement.io/sharing": "time-slicing"}, '"time-slicing" is not exclusive, shared or mig-<profile>'),
    ({"gpu-placement.io/pools": "traning"}, 'no pool named "traning" in the configuration (pools: inference, '
                                            "training)"),
    ({"gpu-placement.io/pools": ","}, "it names no pool"),
    ({"gpu-placement.io/gpu-memory": "20GB"}, '"20GB" is not a quantity'),
    ({"gpu-placement.io/gpu-memory": "16384"}, "is less than 1Mi (a plain number counts bytes, not MiB)"),
    ({"gpu-placement.io/gpu-memory": "-1Gi"}, "not a positive amount of memory"),
    ({"gpu-placement.io/gpu-products": "NVIDIA H100"}, '"NVIDIA H100" is not an nvidia.com/gpu.product label value'),
    ({"gpu-placement.io/cuda": "twelve"}, "is not a version number like 12.4"),
    ({"gpu-placement.io/cuda": "１２.4"}, "U+FF11 FULLWIDTH DIGIT ONE"),
    ({"gpu-placement.io/cuda": "1" * 5000}, "the value is 5000 characters long"),
])
def test_one_precise_sentence_per_bad_annotation(annotations: dict[str, str], phrase: str) -> None:
    start = time.perf_counter()
    message = only_error(annotations)
    assert time.perf_counter() - start < 0.05  # hostile values are refused before any heavy arithmetic
    key = next(iter(annotations))
    assert message.startswith(f"{key}=") and " on namespace team-a: " in message
    assert phrase in message
    assert "; write it as " in message


def test_every_bad_annotation_is_reported_and_the_good_ones_still_hold() -> None:
    parsed = policy({"gpu-placement.io/quota": "nvidia.com/gpu=lots", "gpu-placement.io/pools": "nope",
                     "gpu-placement.io/gpu-memory": "8Gi"})
    assert set(parsed.errors) == {"gpu-placement.io/quota", "gpu-placement.io/pools"}
    assert parsed.gpu_memory_mib == 8192
    assert parsed.entitled(CONFIG)  # a broken quota is a broken quota, not "no GPU access"
    assert not parsed.shapes_ok


def test_control_characters_are_shown_escaped() -> None:
    message = only_error({"gpu-placement.io/sharing": "shared\u202e\n"})
    assert "\u202e" not in message and "\n" not in message
    assert '"shared\\u202e\\u000a"' in message


def test_unknown_namespace_annotations_and_a_quota_on_the_rewritten_name_warn() -> None:
    parsed = policy({"gpu-placement.io/qouta": "nvidia.com/gpu=1", "gpu-placement.io/sharing": "shared",
                     "gpu-placement.io/quota": "nvidia.com/gpu=2"})
    assert parsed.errors == {}
    assert any("gpu-placement.io/qouta on namespace team-a is not read" in w for w in parsed.warnings)
    assert any("quota nvidia.com/gpu.shared instead" in w for w in parsed.warnings)


def test_the_canary_annotation_is_known_and_a_value_other_than_true_warns() -> None:
    """gpu-placement.io/canary is read by the extender (driver rollouts), not by the webhook's policy."""
    assert policy({"gpu-placement.io/canary": "true"}).warnings == ()
    assert policy({"gpu-placement.io/canary": "false"}).warnings == ()
    [warning] = policy({"gpu-placement.io/canary": "yes"}).warnings
    assert warning == ('gpu-placement.io/canary on namespace team-a is "yes": only "true" makes it a canary namespace '
                       '(its pods take new GPU drivers first); write "true" or remove it')
    assert policy({"gpu-placement.io/canary": "yes"}).errors == {}  # a warning: GPU pods are still admitted


@pytest.mark.parametrize(("narrow", "wide", "within"), [
    ("shared", "exclusive", True), ("mig-1g.10gb", "exclusive", True), ("shared", "mig-1g.10gb", True),
    ("mig-1g.10gb", "mig-3g.40gb", True), ("mig-1g.10gb", "mig-1g.10gb", True), ("exclusive", "exclusive", True),
    ("exclusive", "shared", False), ("exclusive", "mig-1g.10gb", False), ("mig-1g.10gb", "shared", False),
    ("mig-3g.40gb", "mig-1g.10gb", False), ("mig-1g.20gb", "mig-2g.10gb", False),
])
def test_sharing_levels(narrow: str, wide: str, within: bool) -> None:
    assert parse_sharing(narrow).within(parse_sharing(wide)) is within


def test_pod_annotations_are_checked_before_the_core_parsers() -> None:
    sharing, problems = pod_annotation_problems({"gpu-placement.io/sharing": "shared",
                                                 "gpu-placement.io/gpu-memory": "4Gi"}, "pod team-a/x")
    assert sharing == Sharing("shared") and problems == []
    start = time.perf_counter()
    sharing, problems = pod_annotation_problems({"gpu-placement.io/sharing": "🙂", "gpu-placement.io/gpu-memory":
                                                 "1e999999999", "gpu-placement.io/min-driver": "550.x",
                                                 "gpu-placement.io/cuda-compat": "major"}, "pod team-a/x")
    assert time.perf_counter() - start < 0.05
    assert sharing is None and len(problems) == 4
    assert all(" on pod team-a/x: " in p for p in problems)


# -- parsed once per namespace change ----------------------------------------------------------------

def test_the_cache_parses_once_per_record() -> None:
    cache = PolicyCache(CONFIG)
    record = NamespaceRecord("team-a", {"gpu-placement.io/quota": "nvidia.com/gpu=4"}, "7")
    first = cache.get("team-a", record)
    assert all(cache.get("team-a", record) is first for _ in range(100))
    assert cache.parses == 1
    changed = NamespaceRecord("team-a", {"gpu-placement.io/quota": "nvidia.com/gpu=8"}, "8")
    assert dict(cache.get("team-a", changed).quota or {}) == {"nvidia.com/gpu": 8}
    assert cache.parses == 2
    assert cache.get("gone", None).quota is None and cache.get("gone", None) is cache.get("gone", None)
    assert cache.parses == 3


@pytest.mark.timeout(120)  # 1,500 reviews over HTTPS: 4.6 s idle, 14 s on a third of one core
def test_namespaces_nobody_knows_stay_within_a_bound_that_hostile_input_cannot_grow(hook: Webhook) -> None:
    """Reviews naming 1,500 random namespaces (the webhook listens on every interface): the cache of
    policies keeps at most its small bound of them, and still every namespace that exists."""
    policies = hook.app.state.admission.policies
    hook.admit(user_pod("team-a", "known", gpus={"nvidia.com/gpu": 1}), "team-a", dry_run=True)
    known = policies.get("team-a", hook.view.namespaces["team-a"])
    for index in range(1500):
        name = f"ns-{index}"
        assert hook.validate(user_pod(name, "p", gpus={"nvidia.com/gpu": 1}), name)["allowed"] is False
    assert len(policies) <= 1 + len(hook.view.namespaces) + policies.unknown_limit == 1 + len(
        hook.view.namespaces) + 1024
    parses = policies.parses
    assert policies.get("team-a", hook.view.namespaces["team-a"]) is known and policies.parses == parses


# -- as a user sees it -------------------------------------------------------------------------------

def test_a_broken_namespace_annotation_denies_gpu_pods_with_its_sentence(hook: Webhook) -> None:
    _, verdict = hook.admit(user_pod("broken", gpus={"nvidia.com/gpu": 1}), "broken")
    assert verdict["allowed"] is False
    assert verdict["status"] == {"status": "Failure", "reason": "Forbidden", "code": 403, "message": (
        'gpu-placement.io/quota="nvidia.com/gpu=４" on namespace broken: it contains U+FF14 FULLWIDTH DIGIT FOUR at '
        "position 16, which is not plain ASCII; write it as nvidia.com/gpu=4,nvidia.com/gpu.shared=16")}
    # A pod that asks for no GPU is not held hostage by the platform team's typo.
    assert hook.validate(user_pod("broken", "web"), "broken")["allowed"] is True


@pytest.mark.parametrize("value", ["nvidia.com/gpu=４", "nvidia.com/gpu=\u200f4", "nvidia.com/gpu=🚀",
                                   "\u202envidia.com/gpu=4", "nvidia.com/gpu=4\x00", "🙂" * 3000])
def test_odd_unicode_in_namespace_annotations_is_a_clean_denial(hook: Webhook, value: str) -> None:
    hook.ingest.event(hook.view, "namespaces", "MODIFIED", namespace("odd", {"gpu-placement.io/quota": value}))
    _, verdict = hook.admit(user_pod("odd", gpus={"nvidia.com/gpu": 1}), "odd")
    assert verdict["allowed"] is False and verdict["status"]["code"] == 403
    message = verdict["status"]["message"]
    assert message.startswith('gpu-placement.io/quota="') and "on namespace odd: " in message
    assert "\u200f" not in message and "\u202e" not in message and "\x00" not in message
    assert len(message) < 600


def test_the_hot_path_does_not_reparse(hook: Webhook) -> None:
    policies = hook.app.state.admission.policies
    pod = user_pod("team-a", gpus={"nvidia.com/gpu": 1})
    hook.admit(pod, "team-a")
    before = policies.parses
    for _ in range(20):
        hook.admit(pod, "team-a", dry_run=True)
    assert policies.parses == before
    hook.ingest.event(hook.view, "namespaces", "MODIFIED", namespace(
        "team-a", {"gpu-placement.io/quota": "nvidia.com/gpu=4", "gpu-placement.io/pools": "inference"}))
    mutated, _ = hook.admit(pod, "team-a", dry_run=True)
    assert policies.parses == before + 1
    assert mutated["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true", "example.com/pool": "inference",
                                               "zone": "a"}


def test_the_pools_hint_names_only_pools_that_exist() -> None:
    """The fix in a pools sentence is a pool of this configuration, the closest to a misspelt one;
    with no pools configured there is none to write, and the sentence says so."""
    assert only_error({"gpu-placement.io/pools": "traning"}).endswith(
        'no pool named "traning" in the configuration (pools: inference, training); write it as training')
    assert only_error({"gpu-placement.io/pools": "gpu-heavy"}).endswith(
        "write it as one or more of inference, training")
    bare = parse_policy(NamespaceRecord("team-b", {"gpu-placement.io/pools": "training"}, "uid-b"), "team-b",
                        parse_config({}))
    assert list(bare.errors.values()) == [
        'gpu-placement.io/pools="training" on namespace team-b: no pool named "training" in the configuration (the '
        "configuration defines no pools); define the pool under pools in gpu-placement's configuration, or remove "
        "the annotation"]
