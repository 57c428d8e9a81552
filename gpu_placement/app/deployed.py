"""The configuration the running service uses, for the commands that answer for it (`explain`, `nodes`,
`rollout`): a command that judges pods with built-in defaults while the cluster runs another
configuration answers for a service that does not exist.

Where it comes from, first found wins: `--config FILE`; else the chart's ConfigMap (the one labelled
`app.kubernetes.io/part-of=gpu-placement` holding `config.yaml`, which the chart mounts into every
process), read from the cluster or found in the snapshot; else the built-in defaults. The `source`
sentence says which, and why when it is the defaults.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from gpu_placement.base.config import Config, ConfigError, load_config, parse_config

__all__ = ["CONFIG_KEY", "LABEL_SELECTOR", "DeployedConfig", "from_config_maps", "from_file"]

LABEL_SELECTOR = "app.kubernetes.io/part-of=gpu-placement"
CONFIG_KEY = "config.yaml"  # the key the chart's ConfigMap holds the configuration under


@dataclass(slots=True, frozen=True)
class DeployedConfig:
    config: Config
    source: str  # "ConfigMap gpu-placement/gpu-placement-config", "--config my.yaml", "built-in defaults (...)"


def from_file(path: str) -> DeployedConfig:
    return DeployedConfig(load_config(path), f"--config {path}")


def from_config_maps(config_maps: Iterable[Mapping[str, Any]], where: str) -> DeployedConfig:
    """The chart's configuration among these ConfigMaps (of a cluster or a snapshot: `where` says
    which, for the sentences). Raises ConfigError when it does not parse, or when two releases are
    found and nothing says which one answers."""
    found = [cm for cm in config_maps if _labelled(cm) and isinstance((cm.get("data") or {}).get(CONFIG_KEY), str)]
    if not found:
        return DeployedConfig(Config(), f"built-in defaults: no ConfigMap labelled {LABEL_SELECTOR} with "
                                        f"{CONFIG_KEY} in {where}; pass --config FILE to use another")
    names = sorted(_name(cm) for cm in found)
    if len(found) > 1:
        raise ConfigError(f"{len(found)} gpu-placement configurations in {where} ({', '.join(names)}): choose one "
                          "with --config FILE, e.g. kubectl get configmap -n NS NAME -o "
                          "jsonpath='{.data.config\\.yaml}' > config.yaml")
    text = found[0]["data"][CONFIG_KEY]
    try:
        config = parse_config(yaml.safe_load(text) or {})
    except (yaml.YAMLError, ConfigError) as exc:
        raise ConfigError(f"ConfigMap {names[0]} ({CONFIG_KEY}) in {where}: {exc}") from exc
    return DeployedConfig(config, f"ConfigMap {names[0]} in {where}")


def _labelled(obj: Mapping[str, Any]) -> bool:
    key, _, value = LABEL_SELECTOR.partition("=")
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return obj.get("kind", "ConfigMap") == "ConfigMap" and labels.get(key) == value


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
