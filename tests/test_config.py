"""The configuration file (gpu_placement/base/config.py): each default is written once, in the dataclasses."""

from __future__ import annotations

import pytest

from gpu_placement.base.config import Config, ConfigError, parse_config


def test_an_empty_file_is_the_dataclass_defaults() -> None:
    """parse_config takes every default from Config and its sections: a default changed in one place is
    changed for the file too."""
    assert parse_config({}) == Config()


def test_every_section_left_empty_is_its_defaults_too() -> None:
    sections = {"validator": {}, "scoring": {"weights": {}}, "telemetry": {}, "dra": {}, "rollout": {},
                "launchFence": {}}
    assert parse_config(sections) == Config()



def test_a_launch_fence_of_one_failure_is_refused() -> None:
    """One failure is not a fence: a threshold below 2 stops the service at start, naming the key."""
    with pytest.raises(ConfigError, match=r"launchFence\.threshold must be at least 2"):
        parse_config({"launchFence": {"threshold": 1}})
    fence = parse_config({"launchFence": {"threshold": 3, "probeMinutes": 5, "probeMaxMinutes": 30}}).launch_fence
    assert (fence.enabled, fence.threshold, fence.probe_minutes, fence.probe_max_minutes) == (True, 3, 5.0, 30.0)


@pytest.mark.parametrize(("section", "key"), [("telemetry", "refreshSeconds"), ("rollout", "soakMinutes")])
def test_a_duration_that_is_no_number_is_refused_in_a_sentence(section: str, key: str) -> None:
    """Durations take an int or a float: the sentence says "a number" (it once read a name off the tuple
    of both, and the user got an AttributeError)."""
    with pytest.raises(ConfigError, match=rf"^{section}\.{key} must be a number, got string 'soon'$"):
        parse_config({section: {key: "soon"}})
