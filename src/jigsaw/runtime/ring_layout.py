"""The ring's byte layout for the pure-Python ring: GENERATED from native/core.pxd.

Do not edit: change ``native/core.pxd`` and run ``python native/ring_layout.py``.
"""

from __future__ import annotations

MAGIC = 0x315257415347494a
VERSION = 1
CONTROL_BYTES = 384
PRODUCER_PID_OFFSET = 32
CONSUMER_PID_OFFSET = 36
CLOSED_OFFSET = 40
TAIL_OFFSET = 128
PUSHED_OFFSET = 136
HEAD_OFFSET = 256
POPPED_OFFSET = 264
FRAME_BYTES = 8
HEADER_BYTES = 120
RECORD_OVERHEAD_BYTES = 128
KIND_DATA = 0x44415441
KIND_SKIP = 0x50494b53
NUM_HOPS = 8
MIN_CAPACITY_BYTES = 1024

# the record header's fields in order: (name, struct code, count)
HEADER_FIELDS = (
    ('request_id', 'Q', 1),
    ('parent_id', 'Q', 1),
    ('app', 'H', 1),
    ('task', 'H', 1),
    ('lane', 'I', 1),
    ('child_index', 'I', 1),
    ('child_count', 'I', 1),
    ('status', 'H', 1),
    ('flags', 'H', 1),
    ('payload_len', 'I', 1),
    ('deadline_ns', 'Q', 1),
    ('created_ns', 'Q', 1),
    ('hops', 'Q', 8),
)
