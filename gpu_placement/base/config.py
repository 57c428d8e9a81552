"""The service configuration file (YAML, every key optional), checked once at start.

Unknown keys and bad values raise `ConfigError` naming the key, so a typo never silently falls back
to a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpu_placement.base.cuda import (
    NGC_RELEASE,
    NgcRelease,
    NgcTable,
    VersionError,
    format_version,
    ngc_table,
    parse_version,
)
from gpu_placement.base.names import GPU_RESOURCE, IMPLICIT_CLASS_PREFIX, LABEL_ENABLED, MIG_RESOURCE_PREFIX
from gpu_placement.base.selectors import LabelSelector, SelectorError

__all__ = ["Config", "ConfigError", "Dra", "LaunchFence", "Pool", "Rollout", "Scoring", "Telemetry", "Validator",
           "load_config", "parse_config"]

Toleration = dict[str, Any]


class ConfigError(ValueError):
    """A configuration problem; the message names the key and says what is expected."""


@dataclass(slots=True, frozen=True)
class Pool:
    name: str
    node_selector: dict[str, str]
    tolerations: tuple[Toleration, ...]


@dataclass(slots=True, frozen=True)
class Validator:
    namespace: str = "gpu-operator"
    selector: LabelSelector = field(default_factory=lambda: LabelSelector.parse("app=nvidia-operator-validator"))
    required: bool = True


@dataclass(slots=True, frozen=True)
class Scoring:
    strategy: str = "binpack"
    # /filter answers the best tier only: the passing nodes tied at the best score, at most this many
    # (drawn at random among equals), so kube-scheduler scores a handful or none (docs/performance.md,
    # "One call per pod"). 0: every passing node, as a scheduler configuration that calls /prioritize
    # wants; the default of a bare `serve`, while the chart, which drops /prioritize, sets 8.
    tier_size: int = 0
    upgrade_required: int = 3
    unhealthy_devices: int = 2
    xid_errors: int = 3


@dataclass(slots=True, frozen=True)
class Telemetry:
    url: str | None = None  # Prometheus base URL (its HTTP API), e.g. http://prometheus.monitoring:9090
    refresh_seconds: float = 15.0
    stale_seconds: float = 60.0
    xid_window_seconds: float = 600.0  # an XID event this recent lowers a node's score


@dataclass(slots=True, frozen=True)
class Dra:
    """Dynamic Resource Allocation (docs/dra.md); off where resource.k8s.io is not served."""

    driver: str = "gpu.nvidia.com"
    device_classes: tuple[str, ...] = ("gpu.nvidia.com", "mig.nvidia.com")
    taint_effect: str = "NoSchedule"  # None: a dry run; NoExecute evicts (docs/dra.md says what that means)
    taints: bool = True  # write DeviceTaintRules for unverified nodes
    # Namespace allocation mode (gpu-placement.io/allocation; docs/dra.md): the default for
    # namespaces without the annotation, the classes claims are written for, what `shared` becomes.
    allocation: str = "device-plugin"  # or dra
    gpu_class: str = "gpu.nvidia.com"
    mig_class: str = "mig.nvidia.com"
    shared_strategy: str = "TimeSlicing"  # TimeSlicing | MPS (NVIDIA's feature gates of the same names) | None
    time_slicing_interval: str = "Default"  # Default | Short | Medium | Long
    mps_active_thread_percentage: int | None = None


@dataclass(slots=True, frozen=True)
class Rollout:
    """Driver rollouts (docs/rollouts.md): how long a node soaks after its driver changed, and what
    soaking means for pods outside canary namespaces."""

    soak_minutes: float = 60.0  # 0: no soak
    soak: str = "prefer"  # prefer: soaking nodes score lowest (canaries: highest); strict: refused
    driver_selector: LabelSelector = field(
        default_factory=lambda: LabelSelector.parse("app.kubernetes.io/component=nvidia-driver"))


@dataclass(slots=True, frozen=True)
class LaunchFence:
    """The fence learned from launch outcomes (docs/rules.md, LaunchFailures): GPU pods of a resource that
    fail to start on a node for the node's reasons, `threshold` in a row, keep that resource's pods off the
    node until evidence lifts it; one probe pod goes through after a backoff of `probeMinutes`, doubled
    after each failed probe up to `probeMaxMinutes`."""

    enabled: bool = True
    threshold: int = 2
    probe_minutes: float = 2.0
    probe_max_minutes: float = 64.0
    # The GPU Operator's device plugin pods (in validator.namespace): one recreated or restarted lifts the fence.
    plugin_selector: LabelSelector = field(
        default_factory=lambda: LabelSelector.parse("app=nvidia-device-plugin-daemonset"))


_DEFAULT_TOLERATIONS: tuple[Toleration, ...] = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)


@dataclass(slots=True, frozen=True)
class Config:
    scheduler_name: str = "gpu-placement"
    gpu_resources: tuple[str, ...] = (GPU_RESOURCE,)
    shared_resource: str = "nvidia.com/gpu.shared"
    gpu_tolerations: tuple[Toleration, ...] = _DEFAULT_TOLERATIONS
    pools: dict[str, Pool] = field(default_factory=dict)
    default_namespace_policy: str = "allow"
    mode: str = "enforce"
    # optIn: gpu-placement acts in namespaces labelled gpu-placement.io/enabled=true only; optOut: in
    # every namespace but those labelled "false". The webhook configurations select the same namespaces.
    namespace_selection: str = "optOut"
    exempt_namespaces: frozenset[str] = frozenset({"kube-system", "gpu-operator"})
    protect_gpu_nodes: bool = True
    # Label the nodes every GPU pod is refused on (gpu-placement.io/refused, by the webhook's leader) and keep
    # the GPU pods the webhook shapes off them by a required node affinity: kube-scheduler then drops them
    # before its sample (docs/performance.md, "Nodes refused before kube-scheduler's sample").
    refused_node_label: bool = False
    # kube-scheduler's percentageOfNodesToScore (the chart passes scheduler.percentageOfNodesToScore): 0, its
    # adaptive sample, as kube-scheduler without the setting. /filter tells from it whether the names it is
    # asked can be a sample cut short (gpu_placement/decide/sample.py).
    percentage_of_nodes_to_score: int = 0
    validator: Validator = field(default_factory=Validator)
    scoring: Scoring = field(default_factory=Scoring)
    telemetry: Telemetry = field(default_factory=Telemetry)
    reservation_ttl_seconds: float = 60.0
    dra: Dra = field(default_factory=Dra)
    rollout: Rollout = field(default_factory=Rollout)
    launch_fence: LaunchFence = field(default_factory=LaunchFence)
    # NGC framework releases newer than the built-in table (data/ngc-framework-cuda.json), each with its source.
    ngc_releases: tuple[NgcRelease, ...] = ()

    @property
    def ngc(self) -> NgcTable:
        """The NGC releases known: the built-in table and `ngcReleases` (built once per set of rows)."""
        return ngc_table(self.ngc_releases)

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Whether a namespace with these labels is one gpu-placement acts in (exemptions aside)."""
        value = labels.get(LABEL_ENABLED)
        return value == "true" if self.namespace_selection == "optIn" else value != "false"

    def is_gpu_resource(self, name: str) -> bool:
        """A GPU resource: the device plugin's (gpuResources, the shared one, MIG slices) or the implicit
        extended resource of a configured DRA device class (`deviceclass.resource.kubernetes.io/gpu.nvidia.com`:
        kube-scheduler allocates a device of the class for it, DRAExtendedResource)."""
        return name in self.gpu_resources or name == self.shared_resource or name.startswith(MIG_RESOURCE_PREFIX) or (
            name.startswith(IMPLICIT_CLASS_PREFIX) and name[len(IMPLICIT_CLASS_PREFIX):] in self.dra.device_classes)


_DEFAULTS = Config()


def load_config(path: str | Path | None) -> Config:
    if path is None:
        return Config()
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    try:
        return parse_config(data or {})
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc


def parse_config(data: Any) -> Config:
    """The configuration a mapping (the YAML file) asks for; every key it leaves out keeps the default of
    `Config` and its sections, the one place each default is written (so `parse_config({}) == Config()`)."""
    d = _DEFAULTS
    top = _Section(data, "")
    validator = _Section(top.take("validator", dict, {}), "validator.")
    scoring = _Section(top.take("scoring", dict, {}), "scoring.")
    weights = _Section(scoring.take("weights", dict, {}), "scoring.weights.")
    telemetry = _Section(top.take("telemetry", dict, {}), "telemetry.")
    dra = _Section(top.take("dra", dict, {}), "dra.")
    rollout = _Section(top.take("rollout", dict, {}), "rollout.")
    fence = _Section(top.take("launchFence", dict, {}), "launchFence.")
    config = Config(
        scheduler_name=_name(top.take("schedulerName", str, d.scheduler_name), "schedulerName"),
        gpu_resources=tuple(top.take_list("gpuResources", str, list(d.gpu_resources))),
        shared_resource=_name(top.take("sharedResource", str, d.shared_resource), "sharedResource"),
        gpu_tolerations=tuple(_toleration(t, f"gpuTolerations[{i}]") for i, t in
                              enumerate(top.take_list("gpuTolerations", dict, list(d.gpu_tolerations)))),
        pools=_pools(top.take("pools", dict, {})),
        default_namespace_policy=top.take_choice("defaultNamespacePolicy", ("allow", "deny"),
                                                 d.default_namespace_policy),
        mode=top.take_choice("mode", ("enforce", "audit"), d.mode),
        namespace_selection=top.take_choice("namespaceSelection", ("optIn", "optOut"), d.namespace_selection),
        exempt_namespaces=frozenset(top.take_list("exemptNamespaces", str, sorted(d.exempt_namespaces))),
        protect_gpu_nodes=top.take("protectGpuNodes", bool, d.protect_gpu_nodes),
        refused_node_label=top.take("refusedNodeLabel", bool, d.refused_node_label),
        percentage_of_nodes_to_score=top.take_percentage("percentageOfNodesToScore", d.percentage_of_nodes_to_score),
        validator=Validator(
            namespace=_name(validator.take("namespace", str, d.validator.namespace), "validator.namespace"),
            selector=_selector(validator.take("selector", str, d.validator.selector.text), "validator.selector"),
            required=validator.take("required", bool, d.validator.required),
        ),
        scoring=Scoring(
            strategy=scoring.take_choice("strategy", ("binpack", "spread", "fragmentation"), d.scoring.strategy),
            tier_size=scoring.take_count("tierSize", d.scoring.tier_size),
            upgrade_required=weights.take_weight("upgradeRequired", d.scoring.upgrade_required),
            unhealthy_devices=weights.take_weight("unhealthyDevices", d.scoring.unhealthy_devices),
            xid_errors=weights.take_weight("xidErrors", d.scoring.xid_errors),
        ),
        telemetry=Telemetry(
            url=telemetry.take("url", str, d.telemetry.url),
            refresh_seconds=telemetry.take_seconds("refreshSeconds", d.telemetry.refresh_seconds),
            stale_seconds=telemetry.take_seconds("staleSeconds", d.telemetry.stale_seconds),
            xid_window_seconds=telemetry.take_seconds("xidWindowSeconds", d.telemetry.xid_window_seconds),
        ),
        reservation_ttl_seconds=top.take_seconds("reservationTTLSeconds", d.reservation_ttl_seconds),
        dra=Dra(
            driver=_name(dra.take("driver", str, d.dra.driver), "dra.driver"),
            device_classes=tuple(_name(c, "dra.deviceClasses[]") for c in
                                 dra.take_list("deviceClasses", str, list(d.dra.device_classes))),
            taint_effect=dra.take_choice("taintEffect", ("NoSchedule", "None", "NoExecute"), d.dra.taint_effect),
            taints=dra.take("taints", bool, d.dra.taints),
            allocation=dra.take_choice("allocation", ("device-plugin", "dra"), d.dra.allocation),
            gpu_class=_name(dra.take("gpuClass", str, d.dra.gpu_class), "dra.gpuClass"),
            mig_class=_name(dra.take("migClass", str, d.dra.mig_class), "dra.migClass"),
            shared_strategy=dra.take_choice("sharedStrategy", ("TimeSlicing", "MPS", "None"), d.dra.shared_strategy),
            time_slicing_interval=dra.take_choice("timeSlicingInterval", ("Default", "Short", "Medium", "Long"),
                                                  d.dra.time_slicing_interval),
            mps_active_thread_percentage=_percent(dra.take("mpsActiveThreadPercentage", int,
                                                           d.dra.mps_active_thread_percentage)),
        ),
        ngc_releases=_ngc_releases(top.take_list("ngcReleases", dict, [])),
        rollout=Rollout(
            soak_minutes=rollout.take_minutes("soakMinutes", d.rollout.soak_minutes),
            soak=rollout.take_choice("soak", ("prefer", "strict"), d.rollout.soak),
            driver_selector=_selector(rollout.take("driverSelector", str, d.rollout.driver_selector.text),
                                      "rollout.driverSelector"),
        ),
        launch_fence=LaunchFence(
            enabled=fence.take("enabled", bool, d.launch_fence.enabled),
            threshold=_at_least(fence.take("threshold", int, d.launch_fence.threshold), 2, "launchFence.threshold"),
            probe_minutes=fence.take_minutes("probeMinutes", d.launch_fence.probe_minutes),
            probe_max_minutes=fence.take_minutes("probeMaxMinutes", d.launch_fence.probe_max_minutes),
            plugin_selector=_selector(fence.take("pluginSelector", str, d.launch_fence.plugin_selector.text),
                                      "launchFence.pluginSelector"),
        ),
    )
    for section in (top, validator, scoring, weights, telemetry, dra, rollout, fence):
        section.reject_unknown()
    if not config.gpu_resources:
        raise ConfigError("gpuResources must name at least one resource, e.g. [nvidia.com/gpu]")
    return config


class _Section:
    """One mapping of the file: typed `take`s, then `reject_unknown` for what nobody took."""

    def __init__(self, data: Any, prefix: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{prefix.rstrip('.') or 'the top level'} must be a mapping, got {_kind(data)}")
        self.data, self.prefix, self.seen = data, prefix, set[str]()

    def take(self, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        """The value under `key` (or `default`), checked to be a `kind`: typed where the caller keeps it."""
        self.seen.add(key)
        value = self.data.get(key, default)
        if value is None and default is None:
            return None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"{self.prefix}{key} must be a {_names(kind)}, got {_kind(value)} {value!r}")
        return value

    def take_list(self, key: str, item: type, default: list[Any]) -> list[Any]:
        values: list[Any] = self.take(key, list, default)
        for index, value in enumerate(values):
            if not isinstance(value, item):
                raise ConfigError(f"{self.prefix}{key}[{index}] must be a {item.__name__}, got {value!r}")
        return values

    def take_choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value: str = self.take(key, str, default)
        if value not in choices:
            raise ConfigError(f"{self.prefix}{key} must be one of {', '.join(choices)}, got {value!r}")
        return value

    def take_seconds(self, key: str, default: float) -> float:
        value: float = self.take(key, (int, float), default)
        if isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{self.prefix}{key} must be a positive number of seconds, got {value!r}")
        return float(value)

    def take_minutes(self, key: str, default: float) -> float:
        value: float = self.take(key, (int, float), default)
        if isinstance(value, bool) or value < 0:
            raise ConfigError(f"{self.prefix}{key} must be a number of minutes, 0 or more, got {value!r}")
        return float(value)

    def take_count(self, key: str, default: int) -> int:
        value: int = self.take(key, int, default)
        if value < 0:
            raise ConfigError(f"{self.prefix}{key} must be an integer, 0 or more, got {value!r}")
        return value

    def take_percentage(self, key: str, default: int) -> int:
        value: int = self.take(key, int, default)
        if not 0 <= value <= 100:
            raise ConfigError(f"{self.prefix}{key} must be an integer from 0 to 100, got {value!r}")
        return value

    def take_weight(self, key: str, default: int) -> int:
        value: int = self.take(key, int, default)
        if not 0 <= value <= 10:
            raise ConfigError(f"{self.prefix}{key} must be an integer from 0 to 10, got {value!r}")
        return value

    def reject_unknown(self) -> None:
        unknown = sorted(str(key) for key in self.data if key not in self.seen)
        if unknown:
            raise ConfigError(f"unknown key{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(self.prefix + k for k in unknown)}; known: "
                              f"{', '.join(self.prefix + k for k in sorted(self.seen))}")


def _names(kind: type | tuple[type, ...]) -> str:
    """What `take` asked for, in words: (int, float) is a number (its __name__ was read off the tuple)."""
    return kind.__name__ if isinstance(kind, type) else "number"


def _kind(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean"}.get(type(value), type(value).__name__)


def _name(value: str, key: str) -> str:
    if not value or any(ch.isspace() for ch in value):
        raise ConfigError(f"{key} must be a non-empty name without spaces, got {value!r}")
    return value


def _at_least(value: int, least: int, key: str) -> int:
    if value < least:
        raise ConfigError(f"{key} must be at least {least} (one failure is not a fence), got {value}")
    return value


def _percent(value: int | None) -> int | None:
    if value is not None and not 0 <= value <= 100:
        raise ConfigError(f"dra.mpsActiveThreadPercentage must be from 0 to 100, got {value!r}")
    return value


def _selector(text: str, key: str) -> LabelSelector:
    try:
        return LabelSelector.parse(text)
    except SelectorError as exc:
        raise ConfigError(f"{key}: {exc}") from exc


_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}


def _toleration(value: dict[str, Any], where: str) -> Toleration:
    unknown = set(value) - _TOLERATION_KEYS
    if unknown:
        raise ConfigError(f"{where} has unknown field(s) {', '.join(sorted(unknown))}; "
                          f"a toleration has {', '.join(sorted(_TOLERATION_KEYS))}")
    if value.get("operator", "Equal") not in ("Equal", "Exists"):
        raise ConfigError(f"{where}.operator must be Equal or Exists, got {value.get('operator')!r}")
    if value.get("effect", "") not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise ConfigError(f"{where}.effect must be NoSchedule, PreferNoSchedule or NoExecute, "
                          f"got {value.get('effect')!r}")
    return dict(value)


def _pools(data: dict[str, Any]) -> dict[str, Pool]:
    pools: dict[str, Pool] = {}
    for name, body in data.items():
        section = _Section(body, f"pools.{name}.")
        selector = section.take("nodeSelector", dict, {})
        for key, value in selector.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ConfigError(f"pools.{name}.nodeSelector must map label keys to string values, "
                                  f"got {key!r}: {value!r}")
        tolerations = tuple(_toleration(t, f"pools.{name}.tolerations[{i}]")
                            for i, t in enumerate(section.take_list("tolerations", dict, [])))
        section.reject_unknown()
        if not selector and not tolerations:
            raise ConfigError(f"pools.{name} needs a nodeSelector or tolerations")
        pools[str(name)] = Pool(str(name), dict(selector), tolerations)
    return pools


_NGC_KEYS = ("release", "cuda", "source", "forwardCompat")


def _ngc_releases(rows: list[dict[str, Any]]) -> tuple[NgcRelease, ...]:
    """`ngcReleases`: NGC framework releases the built-in table lacks, each with the CUDA its release notes
    give and where that was read (docs/rules.md, "Keeping the NGC table current"). A row for a release the
    built-in table has (a later gpu-placement added it) is dropped when it agrees and refused when not."""
    known = ngc_table().releases
    found: dict[str, NgcRelease] = {}
    seen: set[str] = set()
    for index, row in enumerate(rows):
        where = f"ngcReleases[{index}]"
        section = _Section(row, where + ".")
        release = section.take("release", object, None)
        cuda = section.take("cuda", object, None)
        source = section.take("source", object, None)
        forward = section.take_list("forwardCompat", str, [])
        section.reject_unknown()
        if not isinstance(release, str) or not NGC_RELEASE.match(release):
            hint = " (quote it: YAML reads 26.07 as a number)" if isinstance(release, (int, float)) else ""
            raise ConfigError(f"{where}.release must be an NGC release as its tags begin, YY.MM like \"26.07\"{hint}, "
                              f"got {release!r}")
        if release in seen:
            raise ConfigError(f"{where}.release {release} is listed twice in ngcReleases")
        seen.add(release)
        if not isinstance(cuda, str):
            hint = " (quote it: YAML reads 13.3 as a number)" if isinstance(cuda, (int, float)) else ""
            raise ConfigError(f"{where}.cuda must be the CUDA version the release notes give, like \"13.3.1\"{hint}, "
                              f"got {cuda!r}")
        try:
            version = parse_version(cuda)
        except VersionError as exc:
            raise ConfigError(f"{where}.cuda: {exc}") from None
        if not 2 <= len(version) <= 3:
            raise ConfigError(f"{where}.cuda must be major.minor[.patch] like \"13.3.1\", got {cuda!r}")
        if not isinstance(source, str) or not source.strip():
            raise ConfigError(f"{where}.source must say where the CUDA figure was read, e.g. \"PyTorch Release "
                              f"{release} notes: 'Release {release} is based on CUDA {cuda}'\", got {source!r}")
        if release in known:  # a later gpu-placement's own table has it: the cited row stands
            if known[release].cuda[:len(version)] != version:
                raise ConfigError(f"{where}: release {release} is in gpu-placement's own NGC table with CUDA "
                                  f"{format_version(known[release].cuda)} ({known[release].source}), not {cuda}: "
                                  "remove the row from ngcReleases")
            continue
        branches = []
        for position, text in enumerate(forward):
            try:
                branches.append(parse_version(text))
            except VersionError as exc:
                raise ConfigError(f"{where}.forwardCompat[{position}]: {exc} (the lowest driver of a branch the "
                                  "release notes list, like \"535.86\")") from None
        found[release] = NgcRelease(release, version, source.strip(), tuple(branches), configured=True)
    return tuple(found.values())
