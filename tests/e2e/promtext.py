"""Histograms read from a Prometheus /metrics page, subtracted and summarised (mean, quantiles).

Components' own histograms are the figures the side-by-side runs report: kube-scheduler's
scheduling cycle, the API server's time for a Binding POST, the extender's and webhook's answer
times. A page is scraped before and after a batch and the difference is that batch's alone.
Quantiles are interpolated within buckets, as PromQL's `histogram_quantile` does.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Histogram", "histogram"]


@dataclass(slots=True, frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending, +Inf last
    count: float
    total: float  # the sum of the observations, in the metric's unit

    def __sub__(self, before: Histogram) -> Histogram:
        earlier = dict(before.buckets)
        return Histogram(tuple((le, n - earlier.get(le, 0.0)) for le, n in self.buckets),
                         self.count - before.count, self.total - before.total)

    def __add__(self, other: Histogram) -> Histogram:
        theirs = dict(other.buckets)
        bounds = sorted({le for le, _ in self.buckets} | set(theirs))
        ours = dict(self.buckets)
        return Histogram(tuple((le, ours.get(le, 0.0) + theirs.get(le, 0.0)) for le in bounds),
                         self.count + other.count, self.total + other.total)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """Linear within the bucket holding the q-th observation; the highest finite bound if it is
        in the +Inf bucket."""
        if not self.count:
            return 0.0
        rank = q * self.count
        lower, below = 0.0, 0.0
        for upper, cumulative in self.buckets:
            if cumulative >= rank:
                if upper == float("inf"):
                    return lower
                inside = cumulative - below
                return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = upper, cumulative
        return lower


EMPTY = Histogram(((float("inf"), 0.0),), 0.0, 0.0)


def histogram(page: str, name: str, **labels: str) -> Histogram:
    """The histogram `name` on a /metrics page, summed over every series whose labels include
    `labels` (other labels vary: a sum). An absent series is an empty histogram."""
    wanted = tuple(f'{key}="{value}"' for key, value in labels.items())
    # Only the lines of this metric go to the parser: an API server's page runs to megabytes.
    lines = [line for line in page.splitlines() if line.startswith(name)
             and line[len(name):].startswith(("_bucket{", "_sum{", "_count{", "_sum ", "_count "))
             and all(label in line for label in wanted)]
    if not lines:
        return EMPTY
    buckets: dict[float, float] = {}
    count = total = 0.0
    for family in text_string_to_metric_families(f"# TYPE {name} histogram\n" + "\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
            elif sample.name.endswith("_sum"):
                total += sample.value
    return Histogram(tuple(sorted(buckets.items())), count, total)
