"""Struct-of-arrays layout of the simulation state shared by the compiled modules.

Every entity kind is a 2-D array ``[field, entity]`` (int64 or float64; events are
``[entity, field]`` so that one event's fields share a cache line: there are many of
them and they are touched at random); the constants below name the fields.  Cells and streams are
record arrays (``CELL_DTYPE``, 32 bytes, and ``STREAM_DTYPE``, 44 bytes).  Times are int64
nanoseconds.  The whole state is one
:class:`State` namedtuple so the compiled kernel can be stopped and resumed (to grow the cell
pool, the event heap or the kernel-queue rings) without losing anything.

The arrays belong to the Python-side :class:`State` (numpy arrays).  The compiled code sees them
through one :class:`StateType` value: a plain pointer to the state's :func:`descriptor` (each
array's address and shape), made with numba's documented extension API (``OpaqueModel``,
``intrinsic``, ``overload_attribute``).  Reading ``S.ci`` makes a ``numba.carray`` view from that
address and shape; neither the pointer nor the view has a reference-counted owner, so passing
``S`` between compiled functions is one register and counts no references.  Measured
alternatives: a structref of the views counted a reference to itself on every function entry
(``NRT_incref``/``NRT_decref`` took about a fifth of the kernel's time: bench case (a) ran at
3.2 M cells/s against 5 M now); a structref of the plain arrays counts one per field read; a
namedtuple of the views is passed as some 300 machine words per call (4.5 times slower).
The views are valid while the ``State`` lives: only the entry points (``engine.run_kernel``,
``events.ev_push_entry`` and the consensus hooks) take a descriptor, made by a caller that holds
the ``State`` across the call.
"""

from __future__ import annotations

from collections import namedtuple

import cffi
import numpy as np
from llvmlite import ir
from numba import carray, farray, from_dtype, njit, types
from numba.extending import intrinsic, models, overload, overload_attribute, register_model

CELL_SIZE = 514           # CELL_MAX_NETWORK_SIZE, §1
KIST_CELL_COST = 543      # 514 + TLS_PER_CELL_OVERHEAD 29, §6
RELAY_PAYLOAD = 498       # RELAY_PAYLOAD_SIZE_MAX (v0 relay header), §1
ORCONN_HIGH = 32768       # §1
ORCONN_LOW = 16384        # §1
EARLY_WRITE_BYTES = 8 * CELL_SIZE   # §7.3: write at a channel switch when outbuf > 4112 B
WRITE_SHARE_BYTES = 32 * CELL_SIZE  # §7.4: at most 16448 B per write call on rate-limited conns
INT_MAX = 2**31 - 1
MS = 1_000_000            # ns per ms
TCP_MSS_DEFAULT = 536     # Linux's first receive-MSS guess (include/net/tcp.h, tcp_initialize_rcv_mss)
TCP_MAX_QUICKACKS = 16    # at most this many quick ACKs at a time (include/net/tcp.h)
TCP_HEADER_BYTES = 32     # TCP header with the timestamp option, as tcp_measure_rcv_mss counts it
TLS_CELL_BYTES = 543      # a cell with its TLS framing on the wire (KIST's 514 + 29, §6)
# tor's outbuf is a list of 4096-byte chunks (buf_new: default_chunk_size = 4096, less the chunk_t
# header of 40 B, lib/buf/buffers.c); buf_flush_to_tls writes chunk by chunk (flush_chunk_tls), each
# SSL_write one TLS record, each record one send() on the socket
TLS_RECORD_BYTES = 4096 - 40
# what TLS 1.3 adds to each record on the wire: a 5-byte header, the inner content type and a
# 16-byte AEAD tag; a one-cell record is 536 B on loopback (tcpdump of real tor, 2026-12-02: a lone SENDME
# is 536 B on the wire)
TLS_RECORD_OVERHEAD = 22

# scheduler kinds (§3)
SCHED_KIST = 0
SCHED_KISTLITE = 1
SCHED_VANILLA = 2

# channel scheduler states (§2)
ST_IDLE = 0
ST_WAITING_FOR_CELLS = 1
ST_WAITING_TO_WRITE = 2
ST_PENDING = 3

# cell kinds
K_DATA = 0
K_SENDME_CIRC = 1
K_SENDME_STREAM = 2

# event kinds
EV_SCHED = 0        # a = node (the node's timer slot, S.tq: never in the event heap)
EV_ARRIVAL = 1      # a = chan, b = end seq, c = time the flight left the NIC
EV_ACK = 2          # a = chan, b = segments, c = bytes (negative: the flight had a loss)
EV_WRITE = 3        # a = chan: write-ready callback (outbuf -> kernel)
EV_START = 4        # a = transfer, b = its stream pair (-1: take one for interactive flow c)
EV_RESUME = 5       # a = circuit-direction: edge packaging
EV_SAMPLE = 6
EV_INTERVAL = 7     # a = node, b = new interval (ms)
EV_END = 8
EV_DELIVER = 9     # as EV_ARRIVAL, once the receiving node's CPU has processed the flight
EV_DELACK = 10     # a = chan whose data the peer has not acknowledged, b = timer generation
# the heap's representative of a chan's queue of later arrivals (acks): popped, it is an
# EV_ARRIVAL (EV_ACK) and the queue's next event takes its place in the heap (events.ev_push_chan)
EV_ARRIVAL_REP = 11
EV_ACK_REP = 12
# a = chan: the receiver's ACK decision at the end of processing the segment that made it
# (tcp_rcv_established: tcp_data_snd_check before tcp_ack_snd_check), sent unless data left first
EV_ACK_NOW = 13
EV_EDGE_WRITE = 14  # a = stream: its sink edge connection's write callback (outbuf -> application)

# circuit trace (``RunConfig.circuit_trace``, ``ctrace.py``): what an observer at a circuit's guard
# and at its exit sees.  Series of ``S.ctcnt[series, window, traced circuit]`` (a window's counters
# together: a flight's cells fall in one window, each of another circuit):
CT_GUARD_IN_UP = 0      # cells reaching the guard from the client (arrival at the guard)
CT_GUARD_IN_DOWN = 1    # cells reaching the guard from the middle (arrival at the guard)
CT_EXIT_OUT_UP = 2      # cells reaching the exit from the middle, handed to the server (arrival)
CT_EXIT_OUT_DOWN = 3    # cells leaving the exit toward the middle (departure from its NIC)
CT_CLIENT_IN_DOWN = 4   # cells reaching the client from the guard (arrival at the client)
CT_SERIES = 5
# ``S.ctq[q]`` of a traced circuit's queue q: (traced index + 1) << CT_IDX_SHIFT | what its cells
# count for when they leave the queue's node (bit 1 << series; CT_GAP: also the exit's inter-cell gaps)
CT_GAP = 1 << CT_SERIES
CT_IDX_SHIFT = 8
# ``S.ctcirc[field, traced circuit]``: the exit slot of its gap histogram, its last departure at the exit,
# and the ring ``S.ctts[traced circuit]`` of the exit's send times of cells a circuit SENDME will
# acknowledge (fixed SENDME windows: the exit's RTT measurement, as Vegas' timestamps are): head, length
CT_C_SLOT = 0
CT_C_LAST = 1
CT_C_TS_HEAD = 2
CT_C_TS_N = 3
CT_C_FIELDS = 4
# ``S.ctrtt[field, traced circuit, block]``: RTT samples the exit's congestion control took (Vegas)
CT_R_N = 0
CT_R_SUM_MS = 1
CT_R_SUMSQ_MS = 2
CT_R_MIN_MS = 3
CT_R_FIELDS = 4

# kernel-queue rings (tcp.kq_push): one event moves at most every cell of the pool into rings that
# double when full, which takes at most 4 slots per cell at the end of S.kq
KQ_SLOTS_PER_CELL = 4
KQ_SLACK = 1024

# kernel return status
RS_DONE = 0
RS_GROW_CELLS = 1
RS_GROW_EVENTS = 2
RS_GROW_KQ = 3
RS_GROW_STREAMS = 4


# Field numbers: each table's fields are numbered 0, 1, ... in the order written, and the table's
# count (N_*) follows its last field.  Written out, not made in a loop, so that linters and editors
# see every name; tests/sim/test_sim_layout_fields.py checks the numbering, and
# `.venv/bin/python tests/sim/test_sim_layout_fields.py --write` renumbers the block after a field is
# added, removed or moved.
# -- begin field numbers
# globals (int64 array g)
G_NOW = 0
G_END = 1
G_EVN = 2
G_SEQ = 3
G_NFREE = 4
G_RNG = 5
G_NEXT_TR = 6
G_SAMPLE = 7
G_SAMPLE_NS = 8
G_NSAMPLES = 9
G_CELL_RESERVE = 10
G_EV_RESERVE = 11
G_CELLS_SCHEDULED = 12
G_EVENTS = 13
G_RAW_N = 14
G_TOUCHED_N = 15
G_READD_N = 16
G_WW_N = 17
G_QCAP_EXCEEDED = 18
G_NEXT_CHG = 19
G_FC_KIND = 20
G_RUNLOG_N = 21
G_TRACE_CHAN = 22
G_TRACE_N = 23
G_ARMED_N = 24
G_NQ_HEAD = 25
G_NQ_N = 26
G_KQ_END = 27
G_HB_BIN = 28
G_HB_BIN1 = 29
G_TQ_N = 30
G_PFREE_N = 31
G_FLH_N = 32
G_NREG = 33
G_EQ_NFREE = 34
G_EW_STREAM = 35
G_EW_NODE = 36
# the directed channel whose cells each logged run also counts (RunConfig.run_log_chan),
# and the cells the current run has moved onto it
G_RUNLOG_CHAN = 37
G_RUN_CHAN_CELLS = 38
N_G = 39

# run parameters (int64 array pi)
P_CIRCWINDOW = 0
P_CIRC_INC = 1
P_STREAM_WINDOW = 2
P_STREAM_INC = 3
P_CELLQ_HIGH = 4
P_CELLQ_LOW = 5
P_SENDME_INC = 6
P_CWND_INIT = 7
P_CWND_MIN = 8
P_CWND_INC = 9
P_CWND_INC_PCT_SS = 10
P_CWND_INC_RATE = 11
P_SS_MAX = 12
P_SSCAP = 13
P_ALPHA = 14
P_BETA = 15
P_GAMMA = 16
P_DELTA = 17
P_FULL_GAP = 18
P_FULL_MINPCT = 19
P_FULL_PER_CWND = 20
P_EWMA_CWND_PCT = 21
P_EWMA_MAX = 22
P_EWMA_SS = 23
P_EWMA_TICK_MS = 24
P_QCAP = 25
P_TS_CAP = 26
P_EXIT_READ = 27
P_EDGE_WRITE = 28
P_READ_SHARE = 29
P_WAKE_REBASE = 30
N_PI = 31

# run parameters (float64 array pf)
PF_EWMA_F = 0
PF_LN_F = 1
N_PF = 2

# nodes (NI_PEAK_APP/KERN/TOTAL and NI_WPEAK_APP/KERN/TOTAL must stay consecutive: tcp._track_peaks)
NI_SCHED = 0
NI_INTERVAL_MS = 1
NI_TICK_NS = 2
NI_PASS_NS = 3
NI_HEAP_BASE = 4
NI_HEAP_N = 5
NI_TIMER_SEQ = 6
NI_LAST_RUN = 7
NI_NIC_FREE = 8
NI_EWMA_TICK = 9
NI_EWMA_START_MS = 10
NI_APP_BYTES = 11
NI_KERN_BYTES = 12
NI_PEAK_APP = 13
NI_PEAK_KERN = 14
NI_PEAK_TOTAL = 15
NI_RUNS = 16
NI_SYSCALLS = 17
NI_WRITES = 18
NI_CELLS_SENT = 19
NI_CELLS_RECV = 20
NI_CRYPTO = 21
NI_DIGESTS = 22
NI_BYTES_WRITTEN = 23
NI_TIMER_AT = 24
NI_RUN_CELLS_LAST = 25
NI_CPU_FREE = 26
NI_CELL_CPU_NS = 27
NI_XMIT_T = 28
NI_SEND_CPU_NS = 29
NI_TQ_IDX = 30
NI_FC = 31
NI_WPEAK_APP = 32
NI_WPEAK_KERN = 33
NI_WPEAK_TOTAL = 34
NI_DELACKS = 35
NI_READS = 36
NI_SENDMES_HELD = 37
NI_DEADLINE = 38
N_NI = 39

# nodes' float64 fields (nf)
NF_NIC_RATE = 0
NF_FACTOR = 1
NF_XMIT_INC = 2
NF_LN_F = 3
N_NF = 4

# congestion-control parameters (consensus values a node holds, ``S.ncc[node]``; copied to the
# two directions of a circuit when it is built, ``S.dcc[cd]``, §13)
C_CC_ALG = 0
C_CIRCWINDOW = 1
C_SENDME_INC = 2
C_CWND_INIT = 3
C_CWND_MIN = 4
C_CWND_INC = 5
C_CWND_INC_PCT_SS = 6
C_CWND_INC_RATE = 7
C_SS_MAX = 8
C_SSCAP = 9
C_ALPHA = 10
C_BETA = 11
C_GAMMA = 12
C_DELTA = 13
C_FULL_GAP = 14
C_FULL_MINPCT = 15
C_FULL_PER_CWND = 16
C_EWMA_CWND_PCT = 17
C_EWMA_MAX = 18
C_EWMA_SS = 19
N_CC = 20

# the pending heap's key of a chan and the chan's position in it (``S.ckey``)
CK_KEY = 0
CK_POS = 1
N_CK = 2

# chans: the sending side of one direction of a channel (one tor channel object + its socket)
# grouped by what reads them together, eight fields (a cache line) a group: a KIST run's loop per
# cell, then per chan of the run, the kernel queue and stream offsets, the TCP sender
CI_NODE = 0
CI_STATE = 1
CI_CMUX_BASE = 2
CI_CMUX_N = 3
CI_REF_TICK = 4
CI_OB_HEAD = 5
CI_OB_TAIL = 6
CI_OB_BYTES = 7
CI_KS_ENTRY = 8
CI_KS_LIMIT = 9
CI_KS_WRITTEN = 10
CI_TOUCHED = 11
CI_READD = 12
CI_ARMED = 13
CI_WW = 14
CI_WRITE_EV = 15
CI_PEER = 16
CI_KQ_BASE = 17
CI_KQ_POS = 18
CI_KQ_CAP = 19
CI_KQ_N = 20
CI_WRITE_SEQ = 21
CI_SND_NXT = 22
CI_SND_UNA = 23
CI_UNACKED = 24
CI_MSS = 25
CI_SNDBUF = 26
CI_SNDBUF_MAX = 27
CI_OWD_NS = 28
CI_LAST_ARRIVAL = 29
CI_LAST_SEND = 30
CI_RATE_LIMITED = 31
CI_BYTES_SENT = 32
CI_CELLS_SENT = 33
CI_CWND_LIMITED = 34
CI_INIT_CWND = 35
CI_LOSSES = 36
CI_CMUX_CAP = 37
CI_ARR_SEQ = 38
# Nagle at the sender, delayed ACKs at the receiver (tcp.py; lossless links only)
CI_NAGLE = 39
CI_SND_SML = 40
CI_RCV_SEQ = 41
CI_ACK_SEGS = 42
CI_ACK_BYTES = 43
CI_RCV_MSS = 44
CI_LRCV = 45
CI_PINGPONG = 46
CI_DELACK_GEN = 47
CI_DELACK_AT = 48
CI_DELACK_NS = 49
CI_ACK_PUSHED = 50
CI_LSS = 51
CI_RWND = 52
# the clamp up to which tcp_grow_window raises CI_RWND (0: a fixed window)
CI_RWND_MAX = 53
# quick ACKs left (icsk_ack.quick, tcp_incr_quickack in net/ipv4/tcp_input.c)
CI_QUICK = 54
# the chan's queues of arrivals and of acks waiting behind their heap
# representative (events.ev_push_chan): head row, tail row, whether one is in the
# heap, time of the latest; the ack queue's fields follow the arrival queue's
CI_EQ_HEAD = 55
CI_EQ_TAIL = 56
CI_EQ_ON = 57
CI_EQ_LAST = 58
CI_EQK_HEAD = 59
CI_EQK_TAIL = 60
CI_EQK_ON = 61
CI_EQK_LAST = 62
N_CI = 63
# CI_EQK_* = CI_EQ_* + CI_EQ_STRIDE
CI_EQ_STRIDE = CI_EQK_HEAD - CI_EQ_HEAD

# chans' float64 fields (cf)
CF_CWND = 0
CF_SSTHRESH = 1
CF_LOSS_P = 2
N_CF = 3

# circuit queues: one circuit's queue of cells toward one chan
QI_CHAN = 0
QI_CD = 1
QI_N = 2
QI_HEAD = 3
QI_TAIL = 4
QI_HEAP_IDX = 5
QI_LAST_TICK = 6
QI_NEXTQ = 7
QI_CLASS = 8
QI_CIRC = 9
N_QI = 10

# circuit queues' float64 fields (qf)
QF_COUNT = 0
N_QF = 1

# circuit-directions (cd = 2 * circuit + dir; dir 0 = forward, client -> exit)
DI_CIRC = 0
DI_DIR = 1
DI_SRC_CQ = 2
DI_SRC_NODE = 3
DI_SINK_NODE = 4
DI_REV_CQ = 5
DI_PKG_WIN = 6
DI_DELIV_WIN = 7
DI_BLOCKED = 8
DI_READY_HEAD = 9
DI_READY_TAIL = 10
DI_RECV = 11
DI_INFLIGHT = 12
DI_SS = 13
DI_CWND_FULL = 14
DI_NEXT_CC = 15
DI_NEXT_CWND = 16
DI_TS_HEAD = 17
DI_TS_N = 18
DI_RESUME_EV = 19
DI_CWND = 20
DI_HOPS = 21
DI_MAX_INFLIGHT = 22
DI_PACKAGED = 23
DI_SENDMES_RECV = 24
DI_DELIVERED = 25
DI_FC = 26
DI_BUILT = 27
N_DI = 28

# circuit-directions' float64 fields (df)
DF_MIN_RTT = 0
DF_EWMA_RTT = 1
DF_BDP = 2
N_DF = 3

# streams (s = 2 * pair + dir: the request, then the response; ``S.pair_tr[pair]`` is the pair's
# transfer: regular transfers hold pairs 0 .. G_NREG - 1 for the whole run, interactive exchanges
# take one from the pool above), one 32-byte record each: its
# circuit-direction, cells still to package, cells in all, cells delivered, package and deliver
# windows, next stream in the circuit-direction's ready list, whether it is in that list, the
# edge outbuf toward the application and its pending write, and the cells' payload an exit has
# read from its server but not yet packaged (the edge connection's inbuf, engine.package)
STREAM_DTYPE = np.dtype([("cd", np.int32), ("topkg", np.int32), ("total", np.int32), ("delivered", np.int32),
                         ("pkg_win", np.int32), ("deliv_win", np.int32), ("next", np.int32),
                         ("inready", np.int32), ("ob", np.int32), ("wev", np.int32), ("inbuf", np.int32)],
                        align=True)

# transfers
TI_START = 0
TI_TTFB = 1
TI_TTLB = 2
N_TI = 3

# interactive flows (``network.InteractiveFlow``), one record each: the circuit, the id of the first
# exchange (its exchanges are consecutive transfer ids), how many, the next one to start, and the
# cells of a request and of a response (FL_REQ, FL_RESP consecutive).  An exchange takes a stream
# pair from the pool (``S.pfree``) when it starts and gives it back when its answer has arrived,
# so that millions of exchanges need no stream records of their own (engine._start_transfer).
FL_CIRC = 0
FL_FIRST_TR = 1
FL_N = 2
FL_K = 3
FL_REQ = 4
FL_RESP = 5
N_FL = 6

# cells (pool): one 32-byte record per cell, so that a 32-byte aligned pool keeps each cell in one
# half of a cache line: next cell in its FIFO, circuit queue, kind, stream, and the times it
# entered the circuit queue and the kernel
CELL_DTYPE = np.dtype([("next", np.int32), ("cq", np.int32), ("kind", np.int32), ("stream", np.int32),
                       ("t_enq", np.int64), ("t_kern", np.int64)], align=True)
assert CELL_DTYPE.itemsize == 32

# events (heap; one row per event)
E_T = 0
E_SEQ = 1
E_KIND = 2
E_A = 3
E_B = 4
E_C = 5
N_EV = 6
# queued chan events (``S.evq``): an event's fields, then the next row of its queue (-1: last)
N_EQ = N_EV + 1
EQ_NEXT = N_EV

# per-circuit delay sums
CS_APP_NS = 0
CS_KERN_NS = 1
CS_APP_N = 2
CS_KERN_N = 3
N_CS = 4

# node series (cumulative, sampled)
# (NS_PEAK_*: the peak since the previous sample)
NS_RUNS = 0
NS_SYSCALLS = 1
NS_CELLS_SENT = 2
NS_WRITES = 3
NS_APP_BYTES = 4
NS_KERN_BYTES = 5
NS_CELLS_RECV = 6
NS_CRYPTO = 7
NS_DIGESTS = 8
NS_BYTES_WRITTEN = 9
NS_PEAK_APP = 10
NS_PEAK_KERN = 11
NS_PEAK_TOTAL = 12
N_NS = 13
# -- end field numbers

# delay histograms: log-spaced bins from 1 us, HIST_PER_DECADE bins per decade, 8 decades
HIST_PER_DECADE = 40
HIST_BINS = 8 * HIST_PER_DECADE + 2   # [0] = below 1 us, [-1] = above 100 s

#: a table of fields per entity (``S.ci[L.CI_NODE, c]``) stored entity by entity: Fortran order,
#: so that the fields of one chan, circuit queue or node share cache lines (a kernel step reads
#: several fields of a few random entities; field by field, each read was a cache line of its own)
ENTITY_MAJOR = "F"

#: every state array: (name, dtype, dimensions[, ENTITY_MAJOR]); the order of :class:`State` and
#: of the descriptor; the others are C-contiguous
FIELDS = (
    ("g", np.int64, 1),
    ("pi", np.int64, 1),
    ("pf", np.float64, 1),
    ("ni", np.int64, 2, ENTITY_MAJOR),
    ("nf", np.float64, 2, ENTITY_MAJOR),
    ("ci", np.int64, 2, ENTITY_MAJOR),
    ("cf", np.float64, 2, ENTITY_MAJOR),
    ("qi", np.int64, 2, ENTITY_MAJOR),
    ("qf", np.float64, 2, ENTITY_MAJOR),
    ("di", np.int64, 2, ENTITY_MAJOR),
    ("df", np.float64, 2, ENTITY_MAJOR),
    ("ts", np.int64, 2),
    ("si", STREAM_DTYPE, 1),
    ("ti", np.int64, 2, ENTITY_MAJOR),
    ("tr_order", np.int64, 1),
    ("cells", CELL_DTYPE, 1),
    ("ev", np.int64, 2),
    ("pend_heap", np.int64, 1),
    ("cmux_heap", np.int64, 1),
    ("touched", np.int64, 1),
    ("readd", np.int64, 1),
    ("ww", np.int64, 1),
    ("ser_chan", np.int64, 2),
    ("ser_node", np.int64, 3),
    ("hist", np.int64, 3),
    ("hedge", np.int64, 1),
    ("circ_sum", np.int64, 2, ENTITY_MAJOR),
    ("raw", np.int64, 2),
    ("chg", np.int64, 2),
    ("runlog", np.int64, 2),
    ("trace", np.int64, 2),
    # per chan: its pending-heap key (§10.1) and its position in that heap (-1: absent), side by side
    # so that a sift step reads and writes one small array instead of the chan's wide ci row
    ("ckey", np.float64, 2, ENTITY_MAJOR),
    ("armed", np.int64, 1),
    ("nq", np.int64, 2),
    ("evq", np.int64, 2),
    ("eqfree", np.int64, 1),
    ("kq", np.int32, 1),
    ("free", np.int32, 1),
    ("ncc", np.int64, 2),
    ("dcc", np.int64, 2),
    ("ser_hist", np.int64, 4),
    ("tq", np.int64, 1),
    ("pair_tr", np.int64, 1),
    ("pfree", np.int64, 1),
    ("fl", np.int64, 2, ENTITY_MAJOR),
    ("flheap", np.int64, 1),
    # circuit trace (empty when not asked for): per circuit queue, counts per window, per traced
    # circuit, the exits' gap histograms per block, RTT samples per block (see CT_* above)
    ("ctq", np.int64, 1),
    ("ctcnt", np.int32, 3),
    ("ctcirc", np.int64, 2),
    ("ctgap", np.int64, 3),
    ("ctrtt", np.float64, 3),
    ("ctts", np.int64, 2),
    # the trace's window and block lengths (ns), the bin of the last gap recorded (ctrace._gap_bin),
    # when recording cells starts (ns: CircuitTraceConfig.start_s less a second), and the windows and
    # block the last flight fell in (ctrace._slot_of); per node, ns a byte takes on its NIC (0: unlimited)
    ("ctdt", np.int64, 1),
    ("ctnspb", np.float64, 1),
    # beside each slot of ``kq``, ``ctq`` of its cell's queue, written when the cell enters the kernel
    # (tcp.kq_push), its record in the cache then: the trace reads it instead of the cell's record
    ("ctkq", np.int32, 1),
)

State = namedtuple("State", [f[0] for f in FIELDS])


def _order(field) -> str:
    return field[3] if len(field) > 3 else "C"


class StateType(types.Type):
    """The numba type of the compiled code's view of a :class:`State`: one plain pointer, to the
    :func:`descriptor` of its arrays (each array's address and shape, ``DESC_SLOTS`` int64 each).

    It is not reference-counted (its data model is numba's documented ``OpaqueModel``), so
    passing it between compiled functions costs one register and no ``NRT_incref``: a structref
    here counted a reference on every function entry, about a fifth of the kernel's time.  Each
    field read (``S.ci``) is a ``numba.carray`` view made from the address and shape in the
    descriptor (two or three loads from one cache line, marked invariant so that LLVM keeps them
    in registers, ``_invariant_load``; the view has no owner to count either).
    ``lean``: the run keeps no raw delay samples, no chan trace and no circuit trace, and code
    compiled for it leaves that bookkeeping out (``keeps_records`` is the constant False)."""

    def __init__(self, lean: bool):
        self.lean = lean
        super().__init__(name=f"kistexp.sim.State(lean={lean})")


register_model(StateType)(models.OpaqueModel)
STATE_TYPE = StateType(False)
LEAN_STATE_TYPE = StateType(True)

#: int64 slots per field in a descriptor: the address of its first element, then up to 4 extents
DESC_SLOTS = 5


def _invariant_load(builder, ptr):
    """Load a descriptor slot with LLVM's ``!invariant.load``: a descriptor never changes while
    compiled code runs (a grown array gets a new descriptor between kernel calls), so LLVM may
    keep an array's address and shape in a register across the kernel's stores instead of
    reloading them at every ``S.<name>[...]`` (any int64 store could otherwise alias them)."""
    value = builder.load(ptr)
    value.set_metadata("invariant.load", builder.module.add_metadata([]))
    return value


@intrinsic
def _state_at(typingctx, addr, lean):
    """The ``StateType`` pointing at the descriptor at address ``addr``."""
    if not (isinstance(addr, types.Integer) and isinstance(lean, types.BooleanLiteral)):
        return None
    sig = StateType(lean.literal_value)(addr, lean)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

    return sig, codegen


@intrinsic
def _slot(typingctx, S, k):
    """The int64 in slot ``k`` of ``S``'s descriptor."""
    if not (isinstance(S, StateType) and isinstance(k, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p64 = builder.bitcast(args[0], ir.IntType(64).as_pointer())
        return _invariant_load(builder, builder.gep(p64, [args[1]]))

    return types.int64(S, k), codegen


def _pointer_intrinsic(nbtype):
    """An intrinsic: the address in slot ``k`` of ``S``'s descriptor as a pointer to ``nbtype``."""

    @intrinsic
    def ptr(typingctx, S, k):
        if not (isinstance(S, StateType) and isinstance(k, types.Integer)):
            return None
        sig = types.CPointer(nbtype)(S, k)

        def codegen(context, builder, sig, args):
            p64 = builder.bitcast(args[0], ir.IntType(64).as_pointer())
            addr = _invariant_load(builder, builder.gep(p64, [args[1]]))
            return builder.inttoptr(addr, context.get_value_type(sig.return_type))

        return sig, codegen

    return ptr


def _define_field(k: int, name: str, dt, nd: int, order: str) -> None:
    """``S.<name>``: a ``carray`` (``farray`` for an entity-major table) view of field ``k``
    (read-only attribute; the arrays are the caller's, only their contents change)."""
    ptr = _POINTERS[np.dtype(dt)]
    b = DESC_SLOTS * k
    if nd == 1:
        def impl(S):
            return carray(ptr(S, b), (_slot(S, b + 1),))
    elif nd == 2 and order == ENTITY_MAJOR:
        def impl(S):
            return farray(ptr(S, b), (_slot(S, b + 1), _slot(S, b + 2)))
    elif nd == 2:
        def impl(S):
            return carray(ptr(S, b), (_slot(S, b + 1), _slot(S, b + 2)))
    elif nd == 3:
        def impl(S):
            return carray(ptr(S, b), (_slot(S, b + 1), _slot(S, b + 2), _slot(S, b + 3)))
    else:
        def impl(S):
            return carray(ptr(S, b), (_slot(S, b + 1), _slot(S, b + 2), _slot(S, b + 3), _slot(S, b + 4)))
    overload_attribute(StateType, name, jit_options={"cache": True})(lambda S: impl)


_POINTERS = {np.dtype(dt): _pointer_intrinsic(from_dtype(np.dtype(dt))) for dt in {f[1] for f in FIELDS}}
for _k, _f in enumerate(FIELDS):
    _define_field(_k, _f[0], _f[1], _f[2], _order(_f))


#: only its documented ``from_buffer`` is used: in compiled code it turns an array into a pointer
_FFI = cffi.FFI()


def keeps_records(S) -> bool:
    """In compiled code: whether the run keeps raw per-cell delays, a chan trace or a circuit trace,
    known when the code is compiled (from the type of ``S``), so the lean kernel has no branch for
    them."""
    raise NotImplementedError("only in compiled code")


@overload(keeps_records, inline="always")
def _keeps_records(S):
    keeps = not S.lean
    return lambda S: keeps


def is_lean(S: State) -> bool:
    """The run keeps neither raw delays nor a trace: ``engine.run_kernel_lean`` runs it."""
    return S.raw.shape[1] == 0 and S.trace.shape[1] == 0 and S.ctq.shape[0] == 0


def descriptor(S: State) -> np.ndarray:
    """The descriptor of ``S`` for the compiled entry points: per field (order of ``FIELDS``), the
    address of its data and its shape.  Its addresses are valid while ``S`` lives: the caller
    holds ``S`` across the call."""
    desc = np.zeros(DESC_SLOTS * len(FIELDS), dtype=np.int64)
    for k, (arr, field) in enumerate(zip(S, FIELDS, strict=True)):
        name, dt, nd, order = field[0], field[1], field[2], _order(field)
        contiguous = arr.flags.f_contiguous if order == ENTITY_MAJOR else arr.flags.c_contiguous
        if arr.dtype != dt or arr.ndim != nd or not contiguous or not arr.flags.writeable:
            raise TypeError(f"simulator state {name}: {arr.dtype}[{arr.ndim}-d] array, need a writable "
                            f"{order}-contiguous {np.dtype(dt)}[{nd}-d] one")
        desc[DESC_SLOTS * k] = arr.ctypes.data
        desc[DESC_SLOTS * k + 1:DESC_SLOTS * k + 1 + nd] = arr.shape
    return desc


@njit(cache=True)
def state_from(D):
    """The compiled code's view of the :class:`State` whose ``descriptor`` is ``D``."""
    return _state_at(D.ctypes.data, False)


@njit(cache=True)
def lean_state_from(D):
    """``state_from`` for a lean run (``is_lean``)."""
    return _state_at(D.ctypes.data, True)
