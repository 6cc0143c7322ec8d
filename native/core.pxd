# The ring's byte layout, declared once: the record header as a C struct, and every offset and size
# of the control block and of a record. ``core.pyx`` is compiled against it (Cython includes this
# file); ``native/ring_layout.py`` generates ``src/jigsaw/runtime/ring_layout.py`` from it for the
# pure-Python ring, and ``tests/runtime/test_ring_layout.py`` fails when the two disagree.
#
# Control block (CONTROL_BYTES), little endian:
#   0    u64 magic "JIGSAWR1"          8   u32 version          12  u32 control_bytes
#   16   u64 capacity_bytes             24  u64 max_payload_bytes
#   32   u32 producer pid               36  u32 consumer pid     40  u32 closed flag
#   128  u64 tail, 136 u64 pushed      (the producer's cache line)
#   256  u64 head, 264 u64 popped      (the consumer's cache line)
# A record: a frame (u32 record_bytes, u32 kind), the header below, the payload padded to 8 bytes.

from libc.stdint cimport uint16_t, uint32_t, uint64_t

cdef extern from *:
    """
    #include <stddef.h>
    #include <stdint.h>
    #include <string.h>

    /* The record header (jigsaw.runtime._pyring.RecordHeader reads the same fields). */
    typedef struct {
        uint64_t request_id;
        uint64_t parent_id;
        uint16_t app;
        uint16_t task;
        uint32_t lane;
        uint32_t child_index;
        uint32_t child_count;
        uint16_t status;
        uint16_t flags;
        uint32_t payload_len;
        uint64_t deadline_ns;
        uint64_t created_ns;
        uint64_t hops[8];
    } jg_header_t;

    typedef struct {
        uint32_t record_bytes;
        uint32_t kind;
    } jg_frame_t;

    #define JG_MAGIC 0x315257415347494AULL  /* b"JIGSAWR1" read as a little-endian u64 */
    _Static_assert(sizeof(jg_header_t) == 120, "record header must be 120 bytes");
    _Static_assert(offsetof(jg_header_t, payload_len) == 36, "payload_len offset");
    _Static_assert(offsetof(jg_header_t, deadline_ns) == 40, "deadline_ns offset");
    _Static_assert(offsetof(jg_header_t, hops) == 56, "hops offset");
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    #error "the jigsaw ring format is little endian; big-endian hosts use the pure-Python ring"
    #endif

    static inline uint64_t jg_load_acquire(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline uint64_t jg_load_relaxed(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
    static inline void jg_store_release(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline uint32_t jg_load32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void jg_store32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    """
    ctypedef struct jg_header_t:
        uint64_t request_id
        uint64_t parent_id
        uint16_t app
        uint16_t task
        uint32_t lane
        uint32_t child_index
        uint32_t child_count
        uint16_t status
        uint16_t flags
        uint32_t payload_len
        uint64_t deadline_ns
        uint64_t created_ns
        uint64_t hops[8]

    ctypedef struct jg_frame_t:
        uint32_t record_bytes
        uint32_t kind

    const uint64_t JG_MAGIC
    uint64_t jg_load_acquire(const uint64_t *p) nogil
    uint64_t jg_load_relaxed(const uint64_t *p) nogil
    void jg_store_release(uint64_t *p, uint64_t v) nogil
    uint32_t jg_load32(const uint32_t *p) nogil
    void jg_store32(uint32_t *p, uint32_t v) nogil

cdef enum:
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
    KIND_SKIP = 0x50494B53
    NUM_HOPS = 8
    MIN_CAPACITY_BYTES = 1024
