"""Placing a re-plan's new MIG instances around the slots a draining generation still holds
(``runtime.generations.place_around``): pure, on a hand-made one-GPU layout."""

from __future__ import annotations

from pathlib import Path

from jigsaw.gpu.layout import NodeInstance, NodeLayout, place_app, validate_node_layout
from jigsaw.node import load_node
from jigsaw.planner.packer import InstanceRequest
from jigsaw.runtime.generations import place_around

NODE = Path(__file__).resolve().parents[2] / "examples" / "h100x4.toml"
GPU = load_node(NODE).gpu  # H100: 7 compute slices


def _inst(start: int, variant: str, profile: str = "1g.10gb", index: int = 0) -> NodeInstance:
    return NodeInstance(0, profile, start, app="a", task="t", variant=variant, index=index)


def _new_slots(layout: NodeLayout, variant: str) -> set[int]:
    return {i.start for i in layout.instances if i.app == "a" and i.variant == variant}


def test_new_instances_keep_off_the_slots_a_draining_generation_holds() -> None:
    # serving: a/v on slots 0 and 1; draining (the generation before): a/u on slots 2 and 3
    layout = NodeLayout(GPU.name, 1, (_inst(0, "v"), _inst(1, "v", index=1)))
    draining = [_inst(2, "u"), _inst(3, "u", index=1)]
    want = [InstanceRequest("1g.10gb", "t", "w", index=k) for k in range(2)]
    plain = place_app(layout, "a", want, GPU)
    assert _new_slots(plain, "w") & {2, 3}  # without the draining slots it takes them: a drain-first
    placed = place_around(layout, draining, "a", want, GPU)
    assert len(_new_slots(placed, "w")) == 2 and not _new_slots(placed, "w") & {2, 3}
    assert not validate_node_layout(placed, GPU)
    assert all(i.app == "a" for i in placed.instances)  # the stand-ins are not in the result


def test_without_room_beside_them_the_new_instances_go_over_the_draining_slots() -> None:
    layout = NodeLayout(GPU.name, 1, (_inst(0, "v"),))
    draining = [_inst(2, "u"), _inst(3, "u", index=1)]
    want = [InstanceRequest("7g.80gb", "t", "w")]  # the whole GPU: nothing fits around
    placed = place_around(layout, draining, "a", want, GPU)
    assert placed == place_app(layout, "a", want, GPU)
    assert place_around(layout, [], "a", want, GPU) == placed  # nothing draining: place_app's own
