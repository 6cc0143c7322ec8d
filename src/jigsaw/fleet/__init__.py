"""A fleet of jigsaw nodes: its description, its plan (per-node demand shares) and its manifests.

A request never leaves the node it entered (its DAG runs on that node's shared memory), so a
fleet plan is a choice of per-node demand shares, each node serving complete lanes. The
modules, bottom up: ``config`` (the fleet file), ``planner`` (shares and per-node plans),
``render`` (Kubernetes manifests and the load balancer's weighted routing).
"""
