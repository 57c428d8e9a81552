"""The survey as one self-contained HTML page: the fleet drawn by pool and state, then the findings.

Everything is inline (styles, a few lines of script): the page opens from a file, a CI artifact or a
ticket attachment with no network. Each node is a tile coloured by its readiness state and framed by
how it is managed (solid: the GPU Operator, dashed: the operator with a pre-installed driver, a
striped frame: not managed); a pip per GPU; the codes of its findings on it. Choosing a finding lights
up its nodes.
"""

from __future__ import annotations

from html import escape

from gpu_placement.survey.findings import Finding
from gpu_placement.survey.inventory import MANAGED, PREINSTALLED, UNMANAGED, NodeSurvey
from gpu_placement.survey.run import Survey

__all__ = ["STATE_COLOURS", "survey_html"]

# Readiness state -> tile colour (also asserted on the rendered page's pixels in the tests).
# The states are `gpu-placement nodes`'s (report/nodes.py): ready, the ones that take some pods, reason codes.
STATE_COLOURS = {"ready": "#2e9d5b", "canary-only": "#3f8fc4", "last-choice": "#7a9a3a", "upgrade-due": "#4f9e8c",
                 "no-driver-labels": "#b07d2a", "NotValidated": "#d1493f", "NoGPU": "#b2372e",
                 "NodeNotReady": "#8a8f98", "DriverUpgrade": "#e0a526", "MIGReconfiguring": "#c2569b",
                 "BadLabel": "#8e5bd6"}
_OTHER = "#6b7bd6"
_READY = ("GPU nodes a GPU pod can be placed on now: state ready (as gpu-placement nodes shows it), not cordoned, "
          "and no taint that no GPU pod tolerates")
_FRAMES = {MANAGED: "managed", PREINSTALLED: "preinstalled", UNMANAGED: "unmanaged"}
_MAX_PIPS = 16

_STYLE = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1d2330;background:#f6f7f9}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.summary{display:flex;gap:12px;margin:12px 0 4px;flex-wrap:wrap}
.count{background:#fff;border:1px solid #d9dce3;border-radius:8px;padding:8px 14px}
.count b{display:block;font-size:22px}
.legend{display:flex;gap:14px;flex-wrap:wrap;margin:8px 0;font-size:12px;color:#4a5162}
.legend span{display:inline-flex;align-items:center;gap:5px}
.swatch{width:14px;height:14px;border-radius:3px;display:inline-block}
.pool{background:#fff;border:1px solid #d9dce3;border-radius:10px;padding:12px 14px;margin:12px 0}
.pool h3{margin:0 0 10px;font-size:15px}.pool h3 small{color:#5d6475;font-weight:normal}
.tiles{display:flex;flex-wrap:wrap;gap:10px}
.tile{width:168px;min-height:92px;border-radius:8px;padding:8px;color:#fff;box-sizing:border-box;position:relative}
.tile.managed{border:3px solid #1d2330}
.tile.preinstalled{border:3px dashed #1d2330}
.tile.unmanaged{border:3px solid transparent;background-clip:padding-box;
  box-shadow:0 0 0 3px #1d2330,inset 0 0 0 3px #fff}
.tile .name{font-weight:600;font-size:13px;word-break:break-all}
.tile .meta{font-size:11px;opacity:.95}
.pips{display:flex;flex-wrap:wrap;gap:2px;margin:5px 0}
.pip{width:8px;height:8px;background:rgba(255,255,255,.85);border-radius:2px}
.codes{display:flex;flex-wrap:wrap;gap:3px;margin-top:4px}
.code{font-size:10px;background:#1d2330;color:#fff;border-radius:3px;padding:1px 4px}
.tile.lit{outline:4px solid #ffb400;outline-offset:2px}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #d9dce3}
th,td{text-align:left;vertical-align:top;padding:7px 9px;border-bottom:1px solid #e6e8ee;font-size:13px}
th{background:#eef0f4}tr.finding{cursor:pointer}tr.finding:hover,tr.finding.lit{background:#fff7e0}
td.codecell{font-family:ui-monospace,monospace;font-weight:600;white-space:nowrap}
.notes{color:#5d6475;font-size:12px}
"""

_SCRIPT = """
document.querySelectorAll('tr.finding').forEach(function(row){
  row.addEventListener('click',function(){
    var on=!row.classList.contains('lit');
    document.querySelectorAll('.lit').forEach(function(e){e.classList.remove('lit')});
    if(!on)return;
    row.classList.add('lit');
    (row.dataset.nodes||'').split(' ').forEach(function(n){
      var t=document.getElementById('node-'+n);if(t)t.classList.add('lit')});
  })});
document.body.dataset.ready='true';
"""


def _colour(state: str) -> str:
    return STATE_COLOURS.get(state, _OTHER)


def _tile(node: NodeSurvey, codes: list[str]) -> str:
    pips = "".join('<span class="pip"></span>' for _ in range(min(node.gpus, _MAX_PIPS)))
    more = f"+{node.gpus - _MAX_PIPS}" if node.gpus > _MAX_PIPS else ""
    badges = "".join(f'<span class="code">{escape(code)}</span>' for code in codes)
    state = node.state + (" · cordoned" if node.cordoned else "")
    title = f"{node.name}: {node.state}{' - ' + node.why if node.why else ''}; managed: {node.management}"
    return (f'<div class="tile {_FRAMES.get(node.management, "unmanaged")}" id="node-{escape(node.name)}" '
            f'data-node="{escape(node.name)}" data-state="{escape(node.state)}" '
            f'data-management="{escape(node.management)}" style="background:{_colour(node.state)}" '
            f'title="{escape(title)}">'
            f'<div class="name">{escape(node.name)}</div>'
            f'<div class="meta">{escape(state)}</div>'
            f'<div class="pips">{pips}{escape(more)}</div>'
            f'<div class="meta">driver {escape(node.driver or "?")} · CUDA {escape(node.max_cuda or "?")}</div>'
            f'<div class="meta">{escape(node.management)}</div>'
            f'<div class="codes">{badges}</div></div>')


def _finding_row(finding: Finding) -> str:
    nodes = " ".join(f'<a href="#node-{escape(n)}">{escape(n)}</a>' for n in finding.nodes) or "-"
    workloads = "<br>".join(escape(w) for w in finding.workloads) or "-"
    return (f'<tr class="finding" data-code="{escape(finding.code)}" data-nodes="{escape(" ".join(finding.nodes))}">'
            f'<td class="codecell">{escape(finding.code)}</td><td>{escape(finding.what)}</td><td>{nodes}</td>'
            f'<td>{workloads}</td><td>{escape(finding.fix)}</td></tr>')


def _legend(states: list[str]) -> str:
    swatches = "".join(f'<span><i class="swatch" style="background:{_colour(s)}"></i>{escape(s)}</span>'
                       for s in states)
    frames = ('<span><i class="swatch" style="border:2px solid #1d2330"></i>frame: GPU Operator</span>'
              '<span><i class="swatch" style="border:2px dashed #1d2330"></i>dashed: pre-installed driver</span>'
              '<span><i class="swatch" style="box-shadow:0 0 0 2px #1d2330,inset 0 0 0 2px #fff;background:#999">'
              '</i>double frame: not managed</span><span>one pip per GPU</span>')
    return f'<div class="legend">{swatches}{frames}</div>'


def survey_html(survey: Survey, title: str = "GPU cluster survey") -> str:
    codes: dict[str, list[str]] = {}
    for finding in survey.findings:
        for node in finding.nodes:
            if finding.code not in codes.setdefault(node, []):
                codes[node].append(finding.code)
    pools: dict[str, list[NodeSurvey]] = {}
    for node in survey.nodes:
        pools.setdefault(node.pool, []).append(node)
    sections = []
    takes = set(survey.ready())
    for pool, nodes in sorted(pools.items(), key=lambda item: (item[0] == "-", item[0])):
        ready = sum(1 for node in nodes if node.name in takes)
        heading = f"pool {pool}" if pool != "-" else "nodes without a pool"
        tiles = "".join(_tile(node, codes.get(node.name, [])) for node in nodes)
        sections.append(f'<section class="pool" data-pool="{escape(pool)}"><h3>{escape(heading)} '
                        f'<small>{len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs, {ready} ready</small></h3>'
                        f'<div class="tiles">{tiles}</div></section>')
    unmanaged = sum(1 for node in survey.nodes if node.management == UNMANAGED)
    counts = [("GPU nodes", len(survey.nodes), ""), ("GPUs", sum(node.gpus for node in survey.nodes), ""),
              ("ready", len(takes), _READY), ("not managed", unmanaged, ""), ("findings", len(survey.findings), "")]
    summary = "".join(f'<div class="count" data-count="{escape(label)}" title="{escape(why or label)}">'
                      f'<b>{value}</b>{escape(label)}</div>' for label, value, why in counts)
    states = sorted({node.state for node in survey.nodes}, key=lambda s: (s != "ready", s))
    rows = "".join(_finding_row(finding) for finding in survey.findings)
    findings = (f'<table id="findings"><thead><tr><th>Code</th><th>What</th><th>Nodes</th><th>Workloads</th>'
                f'<th>Fix</th></tr></thead><tbody>{rows}</tbody></table>') if rows else "<p>No findings.</p>"
    notes = "".join(f"<li>{escape(note)}</li>" for note in survey.notes)
    config = f"<p class=notes>Configuration: {escape(survey.configuration)}</p>" if survey.configuration else ""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{_STYLE}</style></head>'
            f'<body><h1>{escape(title)}</h1><div class="summary">{summary}</div>{_legend(states)}'
            f'<h2>Fleet by pool</h2>{"".join(sections) or "<p>No GPU nodes.</p>"}'
            f'<h2>Findings ({len(survey.findings)})</h2><p class="notes">Choose a finding to light up its nodes; '
            f'docs/survey.md says what each code means.</p>{findings}'
            f'{f"<ul class=notes>{notes}</ul>" if notes else ""}{config}<script>{_SCRIPT}</script></body></html>')
