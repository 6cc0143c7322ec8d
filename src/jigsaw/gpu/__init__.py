"""Reconfiguring a GPU node: its one running layout, diffs, MIG through NVML, MPS, and the executor.

``layout`` (the node's layout, all apps; ``place_app``) -> ``diff`` (pure: keep / create /
replace / remove, ordered) -> ``executor`` (applies it with ``nvml.MigApplier``, ``mps.MpsManager``
and the daemon's worker callbacks, rolling back on any failure). ``emulated_nvml`` stands in for
the driver on nodes without GPUs; ``doctor`` says what a GPU node lacks. ``partition`` is what
``jigsawd`` drives (``runtime/generations.py``): the MIG instances kept in step with its
generations (created before a new generation starts, destroyed after the old one retired, rolled
back on failure); the daemon keeps unchanged instances' processes across generations itself and
starts ``mps.MpsManager`` daemons per instance. ``executor`` is the same per-instance sequence over
an abstract ``Workers`` (``bench/reconfig.py`` drives it with stand-in processes)::

    rec = make_reconfigurer(node, workers, emulate=emulated, record=history.append)
    running = await asyncio.to_thread(rec.mig.adopt, node.num_gpus)  # MIG mode checked; idle instances
    desired = running
    for app in node.apps:                                            # one layout, all apps
        desired = place_app(desired, app.name, instances_from_plan(plans[app.name]), node.gpu)
    result = await rec.apply(running, desired.without_idle(), decided_at=t_decided)
    running = result.running                                         # uuids and pids filled in

    # a re-plan of one app: laid out against the others, then applied as a diff
    desired = place_app(running, app.name, instances_from_plan(plan), node.gpu)  # PackingError: keep
    result = await rec.apply(running, desired, decided_at=t_decided, reason="bin 42")
    running = result.running  # the new layout, or the old one restored when result.ok is False

``workers`` implements ``executor.Workers`` (start k processes of an instance with the given
environment, wait warm, route to a set of instances, drain, stop); ``running.app_layout(app)``
is an app's part as the plan ``Layout`` the runtime places workers by; ``rec.stats.prometheus()``
goes into ``/metrics`` and the ``record`` events into ``/admin/history``.
"""
