"""The reconfiguration counters of the generation manager in the Prometheus text format
(``/metrics``): processes started and kept, failures, drains, waits, MPS daemons, drain-firsts
by outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jigsaw.runtime.generations import GenerationManager

DRAIN_FIRST_OUTCOMES = ("done", "refused", "failed", "restored", "restore_failed", "skipped", "not_needed",
                        "headroom", "queue", "outgrown")


def prometheus(gm: GenerationManager) -> str:
    """Process and MPS counters of the reconfigurations (for ``/metrics``)."""
    rows = [
        ("jigsaw_reconfig_processes_started_total", "counter",
         "worker processes started by re-plans (the changed instances')",
         gm.processes_started_total),
        ("jigsaw_reconfig_processes_kept_total", "counter",
         "worker processes a re-plan kept serving (same pid, routing changed only)",
         gm.processes_kept_total),
        ("jigsaw_reconfig_failures_total", "counter",
         "re-plans whose new processes failed to start (rolled back; the running plan served on)",
         gm.failures_total),
        ("jigsaw_reconfig_drains_cut_total", "counter",
         "drains a re-plan that needed their MIG slots ended after waiting for them",
         gm.drains_cut_total),
        ("jigsaw_reconfig_cut_forgotten_total", "counter",
         "answered requests of cut drains that were still waiting for late credits (forgotten)",
         gm.cut_requests_total["forgotten"]),
        ("jigsaw_reconfig_cut_resent_total", "counter",
         "unanswered requests of cut drains dispatched again on the app's current generation",
         gm.cut_requests_total["resent"]),
        ("jigsaw_reconfig_cut_failed_total", "counter",
         "unanswered requests of cut drains answered 503/504 (no time left to run them again)",
         gm.cut_requests_total["failed"]),
        ("jigsaw_reconfig_drain_waits_total", "counter",
         "re-plans the app needed that waited for the drains in their way",
         gm.drain_waits_total),
        ("jigsaw_reconfig_drain_wait_seconds_total", "counter",
         "wall seconds those re-plans waited for the drains in their way",
         round(gm.drain_wait_s_total, 3)),
        ("jigsaw_reconfig_drains_total", "counter", "drains of replaced generations that ended",
         gm.drains_total),
        ("jigsaw_reconfig_drain_seconds_total", "counter",
         "wall seconds the replaced generations drained, in all", round(gm.drain_s_total, 3)),
        ("jigsaw_mps_daemons_started_total", "counter", "MPS control daemons started",
         gm.mps_daemons.started_total),
        ("jigsaw_mps_daemons_stopped_total", "counter", "MPS control daemons stopped",
         gm.mps_daemons.stopped_total),
        ("jigsaw_mps_failures_total", "counter", "MPS control daemon starts or stops that failed",
         gm.mps_daemons.failures_total),
        ("jigsaw_mps_daemons", "gauge", "MPS control daemons running",
         len(gm.mps.daemons) if gm.mps is not None else 0),
    ]
    text = "".join(f"# HELP {n} {h}\n# TYPE {n} {t}\n{n} {v}\n" for n, t, h, v in rows)
    if gm.spares is not None:
        text += gm.spares.prometheus()
    name = "jigsaw_reconfig_drain_first_total"
    text += (f"# HELP {name} re-plans whose new MIG instances needed the slots of running ones, by "
             "outcome (done; refused: no lane while they drain; failed before the drain; restored: "
             "failed after it, the running plan brought back; restore_failed: the interim plan serves; "
             "skipped: the running plan held the demand; not_needed: the rate fell to one the running "
             "plan holds before the drain-first; headroom: the new plan planned less than the "
             "running plan serves at full utilization; queue: the running plan's queue was longer "
             "than a drain-first waits; outgrown: the arrivals outgrew the new plan while it "
             "waited for the drains in its way)\n"
             f"# TYPE {name} counter\n")
    return text + "".join(f'{name}{{outcome="{k}"}} {gm.drain_first_total[k]}\n'
                          for k in DRAIN_FIRST_OUTCOMES)
