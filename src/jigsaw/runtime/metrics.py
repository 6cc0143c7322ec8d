"""The frontend's metrics, exposed through ``prometheus_client`` (a custom collector).

Counters and histograms live in the frontend process as plain lists the dispatcher counts into
(no lock, no label lookup on the hot path); per-process gauges are read from the workers' stats
block at scrape time. ``MetricsCollector`` turns them, and the per-app / per-task statistics of
``model_stats`` (the numbers ``/v2/models/{app}/stats`` reports, under Triton's ``nv_inference_*``
names), into ``prometheus_client`` families at scrape time; ``render`` is the exposition text.
Every series of a node on the emulated backend sits next to
``jigsaw_backend_info{kind="emulated"} 1`` so emulated numbers are never read as hardware.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from prometheus_client.core import CollectorRegistry, Metric
from prometheus_client.exposition import generate_latest

from jigsaw.runtime import model_stats as ms
from jigsaw.runtime.model_stats import ModelStats

LATENCY_BUCKETS_US = (100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
                      500_000, 1_000_000, 2_500_000, 5_000_000)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

Labels = tuple[tuple[str, str], ...]


def _family(name: str, help_text: str, kind: str) -> Metric:
    """A family named as written (prometheus_client drops a counter's ``_total`` from the family
    name and writes it back on each sample)."""
    return Metric(name.removesuffix("_total") if kind == "counter" else name, help_text, kind)


def _num(x: float) -> str:
    """A bucket bound as the text format has always written it (``le="1"``, ``le="0.5"``)."""
    return repr(float(x)) if isinstance(x, float) else str(x)


class Counter:
    kind = "counter"

    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels = (), amount: float = 1) -> None:
        self.values[labels] = self.values.get(labels, 0) + amount

    def get(self, labels: Labels = ()) -> float:
        return self.values.get(labels, 0)

    def metric(self) -> Metric:
        m = _family(self.name, self.help, self.kind)
        for labels, v in sorted(self.values.items()):
            m.add_sample(self.name, dict(labels), v)
        return m


class Gauge(Counter):
    kind = "gauge"

    def set(self, labels: Labels, value: float) -> None:
        self.values[labels] = value


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

    def metric(self) -> Metric:
        m = _family(self.name, self.help, "histogram")
        for labels, s in sorted(self.series.items()):
            acc = 0.0
            at = dict(labels)
            for bound, c in zip(self.buckets, s):
                acc += c
                m.add_sample(self.name + "_bucket", {**at, "le": _num(bound)}, acc)
            acc += s[len(self.buckets)]
            m.add_sample(self.name + "_bucket", {**at, "le": "+Inf"}, acc)
            m.add_sample(self.name + "_count", at, acc)
            m.add_sample(self.name + "_sum", at, s[-1])
        return m


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
        self.worker_given_up = Counter(p + "worker_given_up_total",
                                       "Worker processes given up (failed too often: capacity lost, the "
                                       "app re-planned), by app and task.")
        self.lane_shifts = Counter(p + "inference_lane_shifts_total",
                                   "Requests sent to another lane of the running plan than the plan's "
                                   "draw because the drawn lane was backed up (server.lane_shift).")
        self.planner_failures = Counter(p + "planner_failures_total",
                                        "Re-plans that failed or timed out (the running plan kept serving).")

        self.models = ModelStats()  # the per-app / per-task statistics (``model_stats``)
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(MetricsCollector(self))

    def families(self) -> tuple[Counter | Histogram, ...]:
        return (self.success, self.failure, self.dropped, self.late, self.request_duration,
                self.queue_duration, self.compute_duration, self.batch_size, self.inflight, self.busy,
                self.instance_queue, self.slices, self.processes, self.retries, self.worker_failures,
                self.worker_restarts, self.worker_given_up, self.planner_failures, self.lane_shifts)

    def render(self) -> str:
        """The exposition text (Prometheus 0.0.4) of every family."""
        return generate_latest(self._registry).decode()


class MetricsCollector:
    """A ``prometheus_client`` collector over the frontend's families and the shared statistics."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        info = _family("jigsaw_backend_info", "The backend executing the models (emulated: timings come "
                       "from profiles, not hardware).", "gauge")
        info.add_sample("jigsaw_backend_info", {"kind": m.backend_kind}, 1)
        yield info
        for fam in m.families():
            yield fam.metric()
        yield from triton_families(m)


_NV = (("nv_inference_request_success", "Requests answered with a result, per model (app or app.task)."),
       ("nv_inference_request_failure", "Requests answered with an error (app), items dropped (app.task)."),
       ("nv_inference_count", "Inferences performed (requests of an app, items of a task)."),
       ("nv_inference_exec_count", "Executions (an app's requests, a task's batches)."),
       ("nv_inference_request_duration_us", "Cumulative end-to-end (app) or queue+hop+compute (task) time."),
       ("nv_inference_queue_duration_us", "Cumulative queue time."),
       ("nv_inference_compute_input_duration_us", "Cumulative ring hop into the task (per-hop time)."),
       ("nv_inference_compute_infer_duration_us", "Cumulative batch execution time seen by each item."),
       ("nv_inference_compute_output_duration_us", "Cumulative completion ring time back to the frontend."))


def triton_families(m: Metrics) -> Iterator[Metric]:
    """The statistics of ``/v2/models/stats`` under Triton's metric names (counters labelled
    ``model`` and ``version``): one source for both."""
    fams = [_family(name, doc, "counter") for name, doc in _NV]
    failed: dict[tuple[str, str], float] = {}
    for labels, v in m.dropped.values.items():
        d = dict(labels)
        key = (d.get("app", ""), d.get("task", ""))
        failed[key] = failed.get(key, 0.0) + v
    apps = sorted({a for a, _ in m.models.tasks} | set(m.models.apps))
    for app in apps:
        tasks = tuple(t for a, t in m.models.tasks if a == app)
        drops = {t: n for (a, t), n in failed.items() if a == app}
        for e in ms.app_entries(m.models, app, tasks, drops):
            at = {"model": e["name"], "version": e["version"]}
            st = e["inference_stats"]
            values = (st["success"]["count"], st["fail"]["count"], e["inference_count"], e["execution_count"],
                      st["success"]["ns"] / 1e3, st["queue"]["ns"] / 1e3, st["compute_input"]["ns"] / 1e3,
                      st["compute_infer"]["ns"] / 1e3, st["compute_output"]["ns"] / 1e3)
            for fam, (name, _), v in zip(fams, _NV, values):
                fam.add_sample(name + "_total", at, v)
    yield from fams
