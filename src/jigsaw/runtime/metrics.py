"""Prometheus text-format metrics, written by hand (no dependency), named as Triton users expect.

Counters and histograms live in the frontend process; per-process gauges are read from the
workers' stats block at scrape time. Every series of a node on the emulated backend sits next
to ``jigsaw_backend_info{kind="emulated"} 1`` so emulated numbers are never read as hardware.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

LATENCY_BUCKETS_US = (100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
                      500_000, 1_000_000, 2_500_000, 5_000_000)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

Labels = tuple[tuple[str, str], ...]


def _fmt_labels(labels: Labels, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = (*labels, *extra)
    if not items:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    return "{" + body + "}"


def _escape(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(x: float) -> str:
    return repr(float(x)) if isinstance(x, float) else str(x)


class Counter:
    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels = (), amount: float = 1) -> None:
        self.values[labels] = self.values.get(labels, 0) + amount

    def get(self, labels: Labels = ()) -> float:
        return self.values.get(labels, 0)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for labels, v in sorted(self.values.items()):
            yield f"{self.name}{_fmt_labels(labels)} {_num(v)}"


class Gauge(Counter):
    def set(self, labels: Labels, value: float) -> None:
        self.values[labels] = value

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} gauge"
        for labels, v in sorted(self.values.items()):
            yield f"{self.name}{_fmt_labels(labels)} {_num(v)}"


def count_into(series: list[float], buckets: tuple[float, ...], value: float) -> None:
    """Count ``value`` into a histogram's ``series`` (bucket counts, +Inf count, sum): the one rule
    ``Histogram.observe`` and the callers that keep a series (``series_for``) both use."""
    series[bisect.bisect_left(buckets, value)] += 1
    series[-1] += value


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = name, help_text, buckets
        self.series: dict[Labels, list[float]] = {}  # bucket counts..., +Inf count, sum

    def observe(self, labels: Labels, value: float) -> None:
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = [0.0] * (len(self.buckets) + 2)
        count_into(s, self.buckets, value)

    def series_for(self, labels: Labels) -> list[float]:
        """The series of ``labels``, created empty: its bucket counts, the +Inf count, the sum.
        A caller on the hot path keeps it and counts into it with ``count_into`` (no lookup)."""
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = [0.0] * (len(self.buckets) + 2)
        return s

    def count(self, labels: Labels) -> int:
        s = self.series.get(labels)
        return int(sum(s[:-1])) if s else 0

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for labels, s in sorted(self.series.items()):
            acc = 0.0
            for bound, c in zip(self.buckets, s):
                acc += c
                yield f"{self.name}_bucket{_fmt_labels(labels, (('le', _num(bound)),))} {int(acc)}"
            acc += s[len(self.buckets)]
            yield f'{self.name}_bucket{_fmt_labels(labels, (("le", "+Inf"),))} {int(acc)}'
            yield f"{self.name}_sum{_fmt_labels(labels)} {_num(s[-1])}"
            yield f"{self.name}_count{_fmt_labels(labels)} {int(acc)}"


class Metrics:
    """The frontend's metric families."""

    def __init__(self, backend_kind: str) -> None:
        self.backend_kind = backend_kind
        p = "jigsaw_"
        self.success = Counter(p + "inference_request_success_total",
                               "Requests answered with a result.")
        self.failure = Counter(p + "inference_request_failure_total",
                               "Requests answered with an error, by reason (bad_request, shed, "
                               "dropped, timeout, worker_failed, worker_crashed, error, not_ready).")
        self.dropped = Counter(p + "inference_request_dropped_total",
                               "Items dropped by a task before execution, by reason (deadline, stale, "
                               "queue_full); a fan-out child counts once each.")
        self.late = Counter(p + "inference_late_completions_total",
                            "Completion records that arrived after their request was answered.")
        self.request_duration = Histogram(p + "inference_request_duration_us",
                                          "End-to-end latency of answered requests (us).", LATENCY_BUCKETS_US)
        self.queue_duration = Histogram(p + "inference_queue_duration_us",
                                        "Time an item waited before its batch started, per task (us).",
                                        LATENCY_BUCKETS_US)
        self.compute_duration = Histogram(p + "inference_compute_infer_duration_us",
                                          "Batch execution time seen by each item, per task (us).",
                                          LATENCY_BUCKETS_US)
        self.batch_size = Histogram(p + "inference_batch_size", "Items per executed batch, per task/variant.",
                                    BATCH_BUCKETS)
        self.inflight = Gauge(p + "inference_pending_requests", "Requests admitted and not yet answered.")
        self.busy = Gauge(p + "instance_busy_fraction",
                          "Fraction of time since start each worker process spent executing batches.")
        self.instance_queue = Gauge(p + "instance_queue_items", "Items queued or running in each worker.")
        self.slices = Gauge(p + "slices_in_use", "GPU compute slices the running plans use.")
        self.processes = Gauge(p + "worker_processes", "Worker processes, by app.")
        self.retries = Counter(p + "inference_request_retries_total",
                               "Requests dispatched again because a worker holding them failed.")
        self.worker_failures = Counter(p + "worker_failures_total",
                                       "Worker processes found dead or hung, by app, task and reason "
                                       "(exited, hung, start_failed).")
        self.worker_restarts = Counter(p + "worker_restarts_total",
                                       "Worker processes restarted, by app and task.")
        self.lane_shifts = Counter(p + "inference_lane_shifts_total",
                                   "Requests sent to another lane of the running plan than the plan's "
                                   "draw because the drawn lane was backed up (server.lane_shift).")
        self.planner_failures = Counter(p + "planner_failures_total",
                                        "Re-plans that failed or timed out (the running plan kept serving).")

    def render(self) -> str:
        lines = ["# HELP jigsaw_backend_info The backend executing the models (emulated: timings come "
                 "from profiles, not hardware).",
                 "# TYPE jigsaw_backend_info gauge",
                 f'jigsaw_backend_info{{kind="{_escape(self.backend_kind)}"}} 1']
        for fam in (self.success, self.failure, self.dropped, self.late, self.request_duration,
                    self.queue_duration, self.compute_duration, self.batch_size, self.inflight, self.busy,
                    self.instance_queue, self.slices, self.processes, self.retries, self.worker_failures,
                    self.worker_restarts, self.planner_failures, self.lane_shifts):
            lines.extend(fam.render())
        return "\n".join(lines) + "\n"
