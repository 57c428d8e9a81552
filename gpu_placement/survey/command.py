"""`gpu-placement survey`: read the cluster (or a snapshot), survey it, print it in the form asked."""

from __future__ import annotations

from typing import Any

from gpu_placement.base.names import ANN_ADMITTED
from gpu_placement.survey.page import survey_html
from gpu_placement.survey.report import survey_json, survey_markdown, survey_text
from gpu_placement.survey.run import Survey, run_survey, webhook_from_objects
from gpu_placement.survey.workloads import Admit

__all__ = ["FORMATS", "render", "survey_cluster"]

FORMATS = ("text", "markdown", "json", "html")


def survey_cluster(core: Any, access: Any, objects: list[dict[str, Any]], admit: Admit | None = None) -> Survey:
    """The survey of a cluster read by the CLI (`access` live, else a snapshot's `objects`)."""
    notes: list[str] = []
    if access is not None:
        from gpu_placement.survey.live import survey_extras

        extra, notes = survey_extras(access)
        objects = [*objects, *extra]
    source = getattr(core, "config_source", "")
    deployed = source.startswith("ConfigMap") or webhook_from_objects(objects) is not None or any(
        ANN_ADMITTED in ((o.get("metadata") or {}).get("annotations") or {}) for o in objects if o.get("kind") == "Pod")
    return run_survey(core, objects, deployed=deployed, admit=admit, notes=notes)


def render(survey: Survey, output: str) -> str:
    if output == "json":
        return survey_json(survey)
    if output == "markdown":
        return survey_markdown(survey)
    if output == "html":
        return survey_html(survey)
    return survey_text(survey)
