"""A GPU node's hardware side: its one running layout, MIG through NVML, MPS daemons.

``layout`` (the node's layout, all apps; ``place_app``) says where every MIG instance goes;
``partition`` is what ``jigsawd`` drives (``runtime/generations.py``): the MIG instances kept in
step with its generations through ``nvml.MigApplier`` (created before a new generation starts,
destroyed after the old one retired, rolled back on failure); ``mps.MpsManager`` runs the MPS
control daemons per instance. ``emulated_nvml`` stands in for the driver on nodes without GPUs;
``doctor`` says what a GPU node lacks. There is one reconfiguration path, the daemon's:
``bench/reconfig.py`` measures it through a running ``jigsawd --emulate``.
"""
