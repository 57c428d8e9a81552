"""The configuration file (gpu_placement/base/config.py): each default is written once, in the dataclasses."""

from __future__ import annotations

from gpu_placement.base.config import Config, parse_config


def test_an_empty_file_is_the_dataclass_defaults() -> None:
    """parse_config takes every default from Config and its sections: a default changed in one place is
    changed for the file too."""
    assert parse_config({}) == Config()


def test_every_section_left_empty_is_its_defaults_too() -> None:
    sections = {"validator": {}, "scoring": {"weights": {}}, "telemetry": {}, "dra": {}, "rollout": {}}
    assert parse_config(sections) == Config()

