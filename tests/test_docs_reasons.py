"""Every reason sentence the README and the docs quote is one the rules can produce.

The sentences are generated from the rules' own code, not from a hand list: every `_reject(CODE, ...)`
and every `Code: ...` string of gpu_placement/decide/rules.py, read with `ast`, each interpolated value a
wildcard, local sentence parts and helper functions followed to the strings they can be. A quote
matches when some generated sentence and the quote can be the same text, `...` in the quote standing
for anything. kube-scheduler's own reasons, quoted in PodScheduled messages, are checked against
gpu_placement/decide/kubefilters.py the same way. Rewording a rule without its docs fails here.
"""

from __future__ import annotations

import ast
import itertools
import re
from functools import cache
from pathlib import Path

import pytest

from gpu_placement.decide import kubefilters
from gpu_placement.decide.rules import CODES

ROOT = Path(__file__).resolve().parent.parent
WILD = "\x00"  # any text
_LIMIT = 400  # alternatives kept per expression: plenty for the rules' sentences


# -- the sentences the rules can produce -----------------------------------------------------------------
class _Sentences:
    def __init__(self, path: Path) -> None:
        self.tree = ast.parse(path.read_text())
        self.constants = {t.id: n.value.value for n in self.tree.body if isinstance(n, ast.Assign)
                          for t in n.targets if isinstance(t, ast.Name)
                          and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
        self.functions = {n.name: n for n in self.tree.body if isinstance(n, ast.FunctionDef)}

    def templates(self) -> dict[str, set[str]]:
        """Reason code -> every sentence shape the module can give it ("Code: sentence", wildcards)."""
        found: dict[str, set[str]] = {}
        for fn in self.functions.values():
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 2 \
                        and node.func.id in ("_reject", "Rejection"):
                    code = self._constant(node.args[0])
                    if code is None:
                        continue
                    texts = self.alternatives(node.args[1], fn)
                    prefix = f"{code}: " if node.func.id == "_reject" else ""
                    found.setdefault(code, set()).update(prefix + text for text in texts)
                elif isinstance(node, (ast.Return, ast.Assign)) and isinstance(node.value, ast.JoinedStr):
                    self._coded(node.value, fn, found)
        for name, value in self.constants.items():  # whole messages kept as constants
            code = value.split(": ", 1)[0]
            if code in CODES and name != code:
                found.setdefault(code, set()).add(value)
        return found

    def _coded(self, value: ast.JoinedStr, fn: ast.FunctionDef, found: dict[str, set[str]]) -> None:
        """f"{INSUFFICIENT_GPU}: the pod needs ..." and the like."""
        first = value.values[0] if value.values else None
        if isinstance(first, ast.FormattedValue):
            code = self._constant(first.value)
            if code in CODES:
                found.setdefault(code, set()).update(self.alternatives(value, fn))

    def _constant(self, expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return self.constants.get(expr.id)
        return expr.value if isinstance(expr, ast.Constant) and isinstance(expr.value, str) else None

    def alternatives(self, expr: ast.expr, fn: ast.FunctionDef, depth: int = 0) -> list[str]:
        """The texts an expression can be, with WILD for what is not known until run time."""
        if depth > 6:
            return [WILD]
        if isinstance(expr, ast.Constant):
            return [str(expr.value)] if isinstance(expr.value, str) else [WILD]
        if isinstance(expr, ast.JoinedStr):
            parts = [self.alternatives(v.value, fn, depth + 1) if isinstance(v, ast.FormattedValue)
                     and self._constant(v.value) is not None else
                     [str(v.value)] if isinstance(v, ast.Constant) else [WILD] for v in expr.values]
            return _product(parts)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return _product([self.alternatives(expr.left, fn, depth + 1), self.alternatives(expr.right, fn, depth + 1)])
        if isinstance(expr, ast.IfExp):
            return self.alternatives(expr.body, fn, depth + 1) + self.alternatives(expr.orelse, fn, depth + 1)
        if isinstance(expr, ast.Name):
            if expr.id in self.constants:
                return [self.constants[expr.id]]
            assigned = [node.value for node in ast.walk(fn) if isinstance(node, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == expr.id for t in node.targets)]
            found = [text for value in assigned for text in self.alternatives(value, fn, depth + 1)]
            return found[:_LIMIT] or [WILD]
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in self.functions:
            callee = self.functions[expr.func.id]
            returns = [node.value for node in ast.walk(callee) if isinstance(node, ast.Return) and node.value]
            found = [text for value in returns for text in self.alternatives(value, callee, depth + 1)]
            return found[:_LIMIT] or [WILD]
        return [WILD]


def _product(parts: list[list[str]]) -> list[str]:
    return ["".join(combo) for combo in itertools.islice(itertools.product(*parts), _LIMIT)]


@cache
def extender_templates() -> dict[str, set[str]]:
    return _Sentences(ROOT / "gpu_placement" / "decide" / "rules.py").templates()


def scheduler_reasons() -> list[str]:
    """kube-scheduler's own reasons as explain predicts them (module constants of kubefilters)."""
    own = [value for name, value in vars(kubefilters).items() if name.isupper() and isinstance(value, str)
           and (value.startswith("node(s)") or value == kubefilters.TOO_MANY_PODS)]
    return [*own, f"Insufficient {WILD}", f"node(s) didn't satisfy plugin{WILD}"]


# -- the quotes ------------------------------------------------------------------------------------------
_SPAN = re.compile(r"`([^`]+)`")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_PLUGINS = ("NodeName", "NodeUnschedulable", "TaintToleration", "NodeAffinity", "NodeResourcesFit")
# `explain`'s table rows: NODE  VERDICT  -  sentence [the node's own figures]; and its grouped rejections.
_ROW = re.compile(r"^\S+\s+([A-Z][A-Za-z]+)\s+-\s+(.+?)(?:\s+\[[^\]]*\])?$")
_GROUP = re.compile(r"^\s+\d+\s+([A-Z][A-Za-z]+): (.+)$")
_ENTRY = re.compile(r"(\d+) (.+?)(?=, \d+ [A-Za-z(]|$)")


def quotes() -> list[tuple[str, str]]:
    """(file, quoted reason) for every `Code: sentence` in backticks, every entry of a quoted
    `0/N nodes are available: ...` message, and every rejection row of a quoted `explain` output, in
    README.md and docs/*.md."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        name = str(path.relative_to(ROOT))
        fenced = "\n".join(_FENCE.findall(text))
        prose = _FENCE.sub("", text)
        for span in _SPAN.findall(prose):
            quote = " ".join(span.split())
            if "nodes are available:" in quote:
                found += [(name, entry) for entry in _entries(quote)]
            elif quote.split(": ", 1)[0] in CODES and ": " in quote:
                found.append((name, quote))
        for line in fenced.splitlines():
            if "nodes are available:" in line:
                found += [(name, entry) for entry in _entries(" ".join(line.split()))]
                continue
            match = _ROW.match(line) or _GROUP.match(line)
            if match and match.group(1) in CODES:
                found.append((name, f"{match.group(1)}: {match.group(2)}"))
            elif match and match.group(1) in _PLUGINS:
                found.append((name, match.group(2)))
    return found


def _entries(message: str) -> list[str]:
    tail = message.split("nodes are available:", 1)[1].split(" preemption:", 1)[0].strip()
    if tail.endswith(".") and not tail.endswith("..."):
        tail = tail[:-1]  # the message's own full stop
    return [match.group(2) for match in _ENTRY.finditer(tail)]


def compatible(template: str, quote: str) -> bool:
    """Whether one text can match both: WILD in either stands for any text, `...` in a quote too."""
    q = re.sub(r"\.\.\.|…", WILD, quote)
    t = template
    # reach[j]: template[:i] and quote[:j] can be one text (bottom-up over i).
    reach = [True] + [False] * len(q)
    for j in range(1, len(q) + 1):
        reach[j] = reach[j - 1] and q[j - 1] == WILD
    for i in range(1, len(t) + 1):
        row = [reach[0] and t[i - 1] == WILD] + [False] * len(q)
        for j in range(1, len(q) + 1):
            a, b = t[i - 1], q[j - 1]
            if a == WILD or b == WILD:
                row[j] = reach[j] or row[j - 1] or reach[j - 1]
            else:
                row[j] = a == b and reach[j - 1]
        reach = row
    return reach[-1]


def _known(quote: str) -> bool:
    code = quote.split(": ", 1)[0]
    if code in CODES:
        return any(compatible(template, quote) for template in extender_templates().get(code, ()))
    return any(compatible(reason, quote) for reason in scheduler_reasons())


def test_the_rules_yield_sentences_for_every_code() -> None:
    templates = extender_templates()
    assert set(CODES) <= templates.keys(), set(CODES) - templates.keys()
    assert any("supports CUDA up to" in t for t in templates["DriverTooOld"])


@pytest.mark.parametrize(("doc", "quote"), quotes())
def test_every_quoted_reason_is_one_the_rules_produce(doc: str, quote: str) -> None:
    assert _known(quote), f"{doc} quotes a reason the rules cannot produce: {quote!r}"


def test_quotes_are_found_and_stale_ones_would_fail() -> None:
    found = quotes()
    assert len(found) >= 10 and {doc for doc, _ in found} >= {"docs/rules.md", "docs/operations.md"}
    # The sentences docs/operations.md quoted before the node-independent rule:
    assert not _known("NotValidated: nvidia-operator-validator on NODE is not Ready")
    assert not _known("MIGReconfiguring: NODE is applying a MIG layout (nvidia.com/mig.config.state=pending)")
    assert _known("MIGReconfiguring: the node is applying a MIG layout (nvidia.com/mig.config.state=pending)")
    assert _known("DriverTooOld: driver 535.129.03 supports CUDA up to 12.2; ...")
    assert _known("node(s) didn't match Pod's node affinity/selector") and not _known("node(s) looked odd")
