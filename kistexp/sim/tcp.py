"""Kernel side of one socket: send buffer, TCP congestion window, NIC and link (§4 step 4, §6 inputs).

Per socket: ``cwnd`` (segments), ``ssthresh``, ``unacked`` segments, ``mss``, ``notsent`` =
write_seq - snd_nxt (what ``SIOCOUTQNSD`` reports), a send buffer (fixed, or autotuned like
Linux's ``tcp_sndbuf_expand`` to about 4 * max(cwnd, 10) * mss of payload, never shrinking), and a
one-way delay.  Data leaves in flights: whatever the window allows is sent at once, serialised by
the node's NIC (a FIFO at ``nic_rate_bytes_per_s``), arrives one-way-delay later and is acked
one more one-way delay later.  Slow start, congestion avoidance (cwnd grows only while the
sender is cwnd-limited, as Linux's ``tcp_is_cwnd_limited``), restart after idle (RFC 2861, as
``tcp_cwnd_restart``), and a seeded per-segment loss: a flight with a lost segment arrives one
extra RTT later (fast retransmit, at least 0.2 ms) and halves cwnd.  Arrivals stay in order.

With ``LinkConfig.nagle`` (tor never sets ``TCP_NODELAY``: its only ``setsockopt`` calls in
``connection.c`` are ``SO_REUSEADDR``, ``IP_TRANSPARENT``, ``IPV6_V6ONLY``,
``IP_BIND_ADDRESS_NO_PORT`` and ``SO_SNDBUF``/``SO_RCVBUF``) the sender holds a sub-MSS tail
while an earlier sub-MSS segment is unacknowledged (``tcp_nagle_check`` with
``tcp_minshall_check``, net/ipv4/tcp_output.c), and the receiver acknowledges as Linux does
instead of one RTT after every flight. Each write call reaches the socket as one ``send()``
per TLS record (``L.TLS_RECORD_BYTES``: tor flushes its 4 KiB outbuf chunks one
``SSL_write`` each, ``flush_chunk_tls``), and Nagle decides at each of them.


* at once when more than one full frame (``rcv_mss``, the largest segment seen, starting at
  536) is unacknowledged (``__tcp_ack_snd_check``, net/ipv4/tcp_input.c), decided at the end of
  the segment: when its own ACK field releases held data, that data leaves first and carries
  the ACK (``tcp_rcv_established``: ``tcp_data_snd_check`` before ``tcp_ack_snd_check``), so a
  pure ACK never overtakes it (``EV_ACK_NOW``);
* when a read empties the receive queue after two segments shorter than ``rcv_mss``
  (``ICSK_ACK_PUSHED2``), or after one outside pingpong mode (``ICSK_ACK_PUSHED``)
  (``tcp_measure_rcv_mss``; ``tcp_cleanup_rbuf``, net/ipv4/tcp.c);
* with the next data the receiver sends back on the same connection (every segment carries
  the cumulative ACK), which on a tor channel is the reverse direction's cells at the peer's
  next write;
* at once while the window grows (``LinkConfig.receive_window_max_bytes``): each growth grants
  one quick ACK, sent outside pingpong mode (``tcp_grow_window``, net/ipv4/tcp_input.c);
* otherwise when the delayed-ACK timer fires, 40 ms after the first unacknowledged segment
  (``tcp_send_delayed_ack``; ``tcp_delack_timer_handler`` also leaves pingpong mode).

A socket enters pingpong mode when it sends data within ``ato`` (40 ms) of receiving
(``tcp_event_data_sent``, ``inet_csk_inc_pingpong_cnt``): a relay that forwards SENDMEs back
over the connection it receives cells on is in pingpong mode, so its ACKs ride on those
SENDMEs, which leave at its scheduler runs.
"""

from __future__ import annotations

from numba import njit

from kistexp.sim import layout as L
from kistexp.sim.ctrace import trace_flight, tracing
from kistexp.sim.events import cell_list_pop, ev_push, ev_push_chan, rng_uniform, trace_chan

RTO_MIN_NS = 200 * L.MS
LOSS_EXTRA_MIN_NS = 200_000


@njit(cache=True, inline="always")
def kernel_room(S, c):
    return S.ci[L.CI_SNDBUF, c] - (S.ci[L.CI_WRITE_SEQ, c] - S.ci[L.CI_SND_UNA, c])


@njit(cache=True, inline="always")
def _track_peaks(S, node):
    """Raise the node's peaks of queued bytes (application, kernel, both): over the run
    (``NI_PEAK_*``) and since the last sample (``NI_WPEAK_*``, for window measurements)."""
    app = S.ni[L.NI_APP_BYTES, node]
    kern = S.ni[L.NI_KERN_BYTES, node]
    for j, v in enumerate((app, kern, app + kern)):
        if v > S.ni[L.NI_PEAK_APP + j, node]:
            S.ni[L.NI_PEAK_APP + j, node] = v
        if v > S.ni[L.NI_WPEAK_APP + j, node]:
            S.ni[L.NI_WPEAK_APP + j, node] = v


@njit(cache=True, inline="always")
def kq_push(S, c, k):
    """Append cell ``k`` to chan ``c``'s kernel queue, moving a full ring to a segment twice its
    size at the end of ``S.kq`` (``engine.run_kernel`` keeps room there for one event's moves).

    Kernel queues are rings of cell ids (one segment of ``S.kq`` per chan) so that the cells of an
    arriving flight are found without walking a linked list through the cell pool.  A ring is
    as large as its content needs; the segment it leaves is reclaimed when the Python driver
    compacts ``S.kq`` (``state.grow_kq``).
    """
    n = S.ci[L.CI_KQ_N, c]
    cap = S.ci[L.CI_KQ_CAP, c]
    pos = S.ci[L.CI_KQ_POS, c]
    if n == cap:
        base = S.g[L.G_KQ_END]
        old = S.ci[L.CI_KQ_BASE, c]
        for i in range(n):
            j = pos + i
            if j >= cap:
                j -= cap
            S.kq[base + i] = S.kq[old + j]
            if tracing(S):
                S.ctkq[base + i] = S.ctkq[old + j]
        pos = 0
        cap *= 2
        S.ci[L.CI_KQ_BASE, c] = base
        S.ci[L.CI_KQ_CAP, c] = cap
        S.ci[L.CI_KQ_POS, c] = 0
        S.g[L.G_KQ_END] = base + cap
    j = pos + n
    if j >= cap:
        j -= cap
    S.kq[S.ci[L.CI_KQ_BASE, c] + j] = k
    if tracing(S):
        S.ctkq[S.ci[L.CI_KQ_BASE, c] + j] = S.ctq[S.cells[k].cq]
    S.ci[L.CI_KQ_N, c] = n + 1


@njit(cache=True)
def tcp_send(S, c, t):
    """Send what cwnd allows of the not-yet-sent bytes as one flight."""
    tcp_send_upto(S, c, t, S.ci[L.CI_WRITE_SEQ, c])


@njit(cache=True)
def tcp_send_upto(S, c, t, upto):
    """``tcp_send`` for the bytes written up to stream offset ``upto`` (one send() call's end)."""
    notsent = upto - S.ci[L.CI_SND_NXT, c]
    if notsent <= 0:
        return
    unacked = S.ci[L.CI_UNACKED, c]
    if unacked == 0 and t - S.ci[L.CI_LAST_SEND, c] > RTO_MIN_NS + 4 * S.ci[L.CI_OWD_NS, c]:
        # tcp_cwnd_restart: halve per RTO idle, not below min(IW, cwnd)
        rto = RTO_MIN_NS + 4 * S.ci[L.CI_OWD_NS, c]
        cw = S.cf[L.CF_CWND, c]
        restart = min(float(S.ci[L.CI_INIT_CWND, c]), cw)
        S.cf[L.CF_SSTHRESH, c] = max(S.cf[L.CF_SSTHRESH, c], 0.75 * cw)
        delta = t - S.ci[L.CI_LAST_SEND, c] - rto
        while delta > 0 and cw > restart:
            cw = float(int(cw) >> 1)
            delta -= rto
        S.cf[L.CF_CWND, c] = max(cw, restart)
    mss = S.ci[L.CI_MSS, c]
    room = int(S.cf[L.CF_CWND, c]) - unacked
    if room <= 0:
        S.ci[L.CI_CWND_LIMITED, c] = 1
        return
    nbytes = min(notsent, room * mss)
    nagle = S.ci[L.CI_NAGLE, c] == 1
    if nagle:
        # the peer's advertised window bounds the bytes in flight (tcp_snd_wnd_test)
        wnd = S.ci[L.CI_RWND, c] - (S.ci[L.CI_SND_NXT, c] - S.ci[L.CI_SND_UNA, c])
        if wnd < nbytes:
            nbytes = max(wnd, 0) // L.CELL_SIZE * L.CELL_SIZE
            if nbytes <= 0:
                S.ci[L.CI_CWND_LIMITED, c] = 0
                return
    partial = nbytes % mss if nbytes == notsent else 0
    if nagle and partial > 0 and S.ci[L.CI_SND_SML, c] > S.ci[L.CI_SND_UNA, c]:
        # tcp_nagle_check: a sub-MSS tail waits while a small segment is unacknowledged
        nbytes -= partial
        partial = 0
        if nbytes <= 0:
            S.ci[L.CI_CWND_LIMITED, c] = 0
            return
    segs = (nbytes + mss - 1) // mss
    S.ci[L.CI_CWND_LIMITED, c] = 1 if nbytes < notsent or segs == room else 0
    S.ci[L.CI_UNACKED, c] = unacked + segs
    S.ci[L.CI_SND_NXT, c] += nbytes
    S.ci[L.CI_LAST_SEND, c] = t
    node = S.ci[L.CI_NODE, c]
    dep = max(t, S.ni[L.NI_NIC_FREE, node])
    rate = S.nf[L.NF_NIC_RATE, node]
    leave = dep
    if rate > 0.0:
        leave = dep + int(nbytes * 1e9 / rate)
        S.ni[L.NI_NIC_FREE, node] = leave
    owd = S.ci[L.CI_OWD_NS, c]
    arr = leave + owd
    lost = False
    p = S.cf[L.CF_LOSS_P, c]
    if p > 0.0:
        if rng_uniform(S) < 1.0 - (1.0 - p) ** segs:
            lost = True
            arr += max(2 * owd, LOSS_EXTRA_MIN_NS)
            S.ci[L.CI_LOSSES, c] += 1
    if arr < S.ci[L.CI_LAST_ARRIVAL, c]:
        arr = S.ci[L.CI_LAST_ARRIVAL, c]
    S.ci[L.CI_LAST_ARRIVAL, c] = arr
    S.ci[L.CI_BYTES_SENT, c] += nbytes
    if tracing(S) and t >= S.ctdt[3]:
        trace_flight(S, c, S.ci[L.CI_SND_NXT, c] - nbytes, S.ci[L.CI_SND_NXT, c], leave, arr)
    ev_push_chan(S, arr, False, c, S.ci[L.CI_SND_NXT, c], leave)
    if not nagle:
        ev_push_chan(S, arr + owd, True, c, segs, -nbytes if lost else nbytes)
        return
    if partial > 0:
        S.ci[L.CI_SND_SML, c] = S.ci[L.CI_SND_NXT, c]  # tcp_minshall_update
    # this node is the receiver of the reverse direction: the flight carries its ACK, and
    # data sent within ato of a receipt puts that socket in pingpong mode
    r = c ^ 1
    lrcv = S.ci[L.CI_LRCV, r]
    if lrcv >= 0 and t - lrcv < S.ci[L.CI_DELACK_NS, r]:
        S.ci[L.CI_PINGPONG, r] = 1
    if S.ci[L.CI_ACK_BYTES, r] > 0:
        _ack(S, r, arr - S.ci[L.CI_OWD_NS, r])


@njit(cache=True)
def _ack(S, c, t):
    """The receiver of chan ``c``'s data acknowledges everything it has, at time ``t``."""
    ev_push_chan(S, t + S.ci[L.CI_OWD_NS, c], True, c, S.ci[L.CI_ACK_SEGS, c], S.ci[L.CI_ACK_BYTES, c])
    S.ci[L.CI_ACK_SEGS, c] = 0
    S.ci[L.CI_ACK_BYTES, c] = 0
    S.ci[L.CI_DELACK_GEN, c] += 1
    S.ci[L.CI_DELACK_AT, c] = -1
    S.ci[L.CI_ACK_PUSHED, c] = 0  # inet_csk_clear_xmit_timer(ICSK_TIME_DACK) clears icsk_ack.pending
    if S.ci[L.CI_QUICK, c] > 0:
        S.ci[L.CI_QUICK, c] -= 1  # tcp_event_ack_sent -> tcp_dec_quickack_mode: one ACK of new data


@njit(cache=True)
def rcv_segments(S, c, upto, t):
    """A flight of chan ``c`` reached the peer's kernel: decide when it is acknowledged."""
    nbytes = upto - S.ci[L.CI_RCV_SEQ, c]
    if S.ci[L.CI_NAGLE, c] == 0 or nbytes <= 0:
        return
    S.ci[L.CI_RCV_SEQ, c] = upto
    mss = S.ci[L.CI_MSS, c]
    S.ci[L.CI_ACK_SEGS, c] += (nbytes + mss - 1) // mss
    S.ci[L.CI_ACK_BYTES, c] += nbytes
    if _measure_rcv_mss(S, c, nbytes, mss):
        # a segment shorter than rcv_mss sets ICSK_ACK_PUSHED; a second one before the ACK,
        # ICSK_ACK_PUSHED2 (tcp_measure_rcv_mss)
        S.ci[L.CI_ACK_PUSHED, c] = min(S.ci[L.CI_ACK_PUSHED, c] + 1, 2)
    lrcv = S.ci[L.CI_LRCV, c]
    if lrcv >= 0 and t - lrcv > RTO_MIN_NS + 4 * S.ci[L.CI_OWD_NS, c]:
        # tcp_event_data_recv: data after a gap longer than the RTO earns quick ACKs
        # (tcp_incr_quickack: rcv_wnd / (2 * rcv_mss) of them, 2 if that is 0, at most
        # TCP_MAX_QUICKACKS), counted with the rcv_mss this segment has just set. The quick ACKs
        # of a connection's first data are not given: a modelled channel stands for an OR
        # connection that has carried its TLS handshake, VERSIONS/CERTS/NETINFO and the circuit's
        # CREATE/EXTEND cells just before the first modelled cell, so they are spent, and that
        # request/reply exchange has put both sockets in pingpong mode, where quick ACKs do not apply
        q = S.ci[L.CI_RWND, c] // (2 * S.ci[L.CI_RCV_MSS, c])
        q = min(q if q > 0 else 2, L.TCP_MAX_QUICKACKS)
        if q > S.ci[L.CI_QUICK, c]:
            S.ci[L.CI_QUICK, c] = q
    S.ci[L.CI_LRCV, c] = t
    _grow_window(S, c, nbytes, mss)
    at = S.ci[L.CI_DELACK_AT, c]
    ato = S.ci[L.CI_DELACK_NS, c]
    if (S.ci[L.CI_ACK_BYTES, c] > S.ci[L.CI_RCV_MSS, c] or (at >= 0 and at - t <= ato // 4)
            or (S.ci[L.CI_QUICK, c] > 0 and S.ci[L.CI_PINGPONG, c] == 0)):
        # more than one full frame, the delayed ACK due anyway (tcp_send_delayed_ack), or quick
        # ACK mode outside pingpong mode (tcp_in_quickack_mode, __tcp_ack_snd_check). Linux
        # decides this after the segment's own ACK field has been processed and the data it
        # released has been sent (tcp_rcv_established: tcp_ack, tcp_data_queue,
        # tcp_data_snd_check, then tcp_ack_snd_check), so that data carries this ACK and no
        # pure ACK goes ahead of it: the ACK of the peer's flight, which the model delivers as
        # an event of its own at this instant, runs first (it was scheduled earlier)
        ev_push(S, t, L.EV_ACK_NOW, c, 0, 0)
        return
    if at < 0:
        S.ci[L.CI_DELACK_AT, c] = t + ato
        ev_push(S, t + ato, L.EV_DELACK, c, S.ci[L.CI_DELACK_GEN, c], 0)


@njit(cache=True, inline="always")
def _grow_window(S, c, nbytes, mss):
    """tcp_grow_window (net/ipv4/tcp_input.c), which tcp_event_data_recv calls for every arriving
    segment of at least 128 B: while the window (``rcv_ssthresh``) is below its clamp, raise it by
    ``max(2 * advmss, 2 * skb->len)`` (``2 * advmss`` when the skb's overhead is small, as on
    loopback; ``len <= advmss``), at most to the clamp, and set ``icsk_ack.quick |= 1``: one quick
    ACK, which ``__tcp_ack_snd_check`` sends at once unless the socket is in pingpong mode
    (``tcp_in_quickack_mode``). The receiver reads at once, so the free space does not bound the
    window below the clamp (``room = min(window_clamp, tcp_space(sk)) - rcv_ssthresh``), and the
    window the receiver may now advertise is what the sender sees: Linux's sender learns it with
    the next ACK. ``advmss`` is the sender's mss here (the link's, unless capped by the first
    window)."""
    clamp = S.ci[L.CI_RWND_MAX, c]
    wnd = S.ci[L.CI_RWND, c]
    if clamp <= wnd:
        return
    # every modelled segment carries at least one cell (514 B >= 128 B), so each one grows it
    segs = (nbytes + mss - 1) // mss
    wnd = min(clamp, wnd + segs * 2 * mss)
    S.ci[L.CI_RWND, c] = wnd
    if S.ci[L.CI_QUICK, c] < 1:
        S.ci[L.CI_QUICK, c] = 1


@njit(cache=True, inline="always")
def _measure_rcv_mss(S, c, nbytes, mss):
    """tcp_measure_rcv_mss (net/ipv4/tcp_input.c) over a flight: full segments raise ``rcv_mss``
    to the mss; a shorter one raises it to its length if at least ``rcv_mss``, and two equal
    shorter ones in a row (each at least 536 B with headers) set it to theirs. ``rcv_mss`` is
    kept in the same bytes as the unacknowledged count it is compared with (``__tcp_ack_snd_check``:
    more than one full frame), the socket's stream; only the 536-byte floor looks at the
    segment as the wire carries it, each TLS record ``L.TLS_RECORD_OVERHEAD`` longer (a lone
    SENDME is 536 B there, 514 B of cell). True when the tail was a short segment that marks the
    ACK pushed (the ``else`` branch that does not return early)."""
    if nbytes >= mss:
        S.ci[L.CI_RCV_MSS, c] = mss
        S.ci[L.CI_LSS, c] = 0
    tail = nbytes % mss
    if tail == 0:
        return False
    seg = tail
    lss = S.ci[L.CI_LSS, c]
    S.ci[L.CI_LSS, c] = 0
    if seg >= S.ci[L.CI_RCV_MSS, c]:
        S.ci[L.CI_RCV_MSS, c] = seg
        return False
    records = (seg + L.TLS_RECORD_BYTES - 1) // L.TLS_RECORD_BYTES
    if seg + records * L.TLS_RECORD_OVERHEAD + L.TCP_HEADER_BYTES >= L.TCP_MSS_DEFAULT + 20:
        S.ci[L.CI_LSS, c] = seg
        if seg == lss:
            S.ci[L.CI_RCV_MSS, c] = seg
            return False
    return True


@njit(cache=True, inline="always")
def rcv_read(S, c, upto, t):
    """The receiving process has read chan ``c``'s data up to ``upto`` (tcp_cleanup_rbuf, net/ipv4/tcp.c).

    When the read emptied the receive queue (no later flight has arrived): an ACK if two short
    segments came since the last one (``ICSK_ACK_PUSHED2``, in pingpong mode too), or one did and
    the socket is not in pingpong mode (``ICSK_ACK_PUSHED``). Always when the read reopens at
    least half the window (the window it can now advertise is at least twice what was left)."""
    if S.ci[L.CI_NAGLE, c] == 0:
        return
    acked = S.ci[L.CI_ACK_BYTES, c]
    if acked <= 0:
        return
    pushed = S.ci[L.CI_ACK_PUSHED, c]
    drained = upto >= S.ci[L.CI_RCV_SEQ, c]
    if drained and (pushed == 2 or (pushed == 1 and S.ci[L.CI_PINGPONG, c] == 0)):
        _ack(S, c, t)
    elif 2 * acked >= S.ci[L.CI_RWND, c]:
        _ack(S, c, t)


@njit(cache=True)
def on_ack_now(S, c, t):
    """``tcp_ack_snd_check`` at the end of a segment: the ACK decided on, unless data sent since
    has carried it."""
    if S.ci[L.CI_ACK_BYTES, c] > 0:
        _ack(S, c, t)


@njit(cache=True)
def on_delack(S, c, gen, t):
    """tcp_delack_timer_handler: acknowledge, and leave pingpong mode."""
    if gen != S.ci[L.CI_DELACK_GEN, c]:
        return
    S.ci[L.CI_DELACK_AT, c] = -1
    if S.ci[L.CI_ACK_BYTES, c] > 0:
        S.ci[L.CI_PINGPONG, c] = 0
        S.ni[L.NI_DELACKS, S.ci[L.CI_PEER, c]] += 1  # Linux counts these as TcpExt DelayedACKs
        _ack(S, c, t)


@njit(cache=True)
def write_to_kernel(S, c, t):
    """One write call (``connection_handle_write``): outbuf -> kernel, whole cells.

    At most one bucket share (16448 B, §7.4) on rate-limited connections, and what the send
    buffer has room for.  Returns True when the outbuf is now below ``orconn_low`` (the caller
    then signals ``wants_writes``, §2).
    """
    ob = S.ci[L.CI_OB_BYTES, c]
    if ob <= 0:
        return True
    node = S.ci[L.CI_NODE, c]
    S.ni[L.NI_WRITES, node] += 1
    share = L.WRITE_SHARE_BYTES if S.ci[L.CI_RATE_LIMITED, c] == 1 else ob
    room = kernel_room(S, c)
    moved = 0
    nagle = S.ci[L.CI_NAGLE, c] == 1
    start = S.ci[L.CI_WRITE_SEQ, c]
    record_end = start + L.TLS_RECORD_BYTES
    while ob > 0 and moved + L.CELL_SIZE <= share and room >= L.CELL_SIZE:
        if nagle and S.ci[L.CI_WRITE_SEQ, c] + L.CELL_SIZE > record_end:
            # one send() per TLS record: Nagle decides on each (tcp_sendmsg -> tcp_push)
            tcp_send_upto(S, c, t, record_end)
            record_end += L.TLS_RECORD_BYTES
        k = cell_list_pop(S, S.ci, L.CI_OB_HEAD, L.CI_OB_TAIL, c)
        S.ci[L.CI_WRITE_SEQ, c] += L.CELL_SIZE
        S.cells[k].t_kern = t
        S.cells[k].next = -1
        kq_push(S, c, k)
        ob -= L.CELL_SIZE
        room -= L.CELL_SIZE
        moved += L.CELL_SIZE
    S.ci[L.CI_OB_BYTES, c] = ob
    if moved > 0:
        S.ni[L.NI_BYTES_WRITTEN, node] += moved
        S.ni[L.NI_APP_BYTES, node] -= moved
        S.ni[L.NI_KERN_BYTES, node] += moved
        _track_peaks(S, node)
        tcp_send(S, c, t)
        trace_chan(S, c, t)
    if ob > 0 and room >= L.CELL_SIZE and S.ci[L.CI_WRITE_EV, c] == 0:
        # share-limited: the write event fires again in the next pass
        S.ci[L.CI_WRITE_EV, c] = 1
        ev_push(S, t, L.EV_WRITE, c, 0, 0)
    return ob < L.ORCONN_LOW


@njit(cache=True)
def on_ack(S, c, t, segs, nbytes):
    """An ACK for one flight: free the send buffer, grow or cut cwnd, send more, wake the writer."""
    lost = nbytes < 0
    if lost:
        nbytes = -nbytes
    before = S.ci[L.CI_UNACKED, c]
    S.ci[L.CI_UNACKED, c] = before - segs
    S.ci[L.CI_SND_UNA, c] += nbytes
    node = S.ci[L.CI_NODE, c]
    S.ni[L.NI_KERN_BYTES, node] -= nbytes
    cw = S.cf[L.CF_CWND, c]
    if lost:
        cw = max(cw / 2.0, 2.0)
        S.cf[L.CF_SSTHRESH, c] = cw
    elif cw < S.cf[L.CF_SSTHRESH, c]:
        if S.ci[L.CI_CWND_LIMITED, c] == 1 or cw < 2 * before:
            cw = min(cw + segs, max(S.cf[L.CF_SSTHRESH, c], cw + 1.0))
    elif S.ci[L.CI_CWND_LIMITED, c] == 1:
        cw += segs / cw
    S.cf[L.CF_CWND, c] = cw
    if S.ci[L.CI_SNDBUF_MAX, c] > 0:
        # autotuned send buffer (tcp_sndbuf_expand): grows with cwnd, never shrinks
        want = 4 * max(int(cw), 10) * S.ci[L.CI_MSS, c]
        if want > S.ci[L.CI_SNDBUF_MAX, c]:
            want = S.ci[L.CI_SNDBUF_MAX, c]
        if want > S.ci[L.CI_SNDBUF, c]:
            S.ci[L.CI_SNDBUF, c] = want
    tcp_send(S, c, t)
    trace_chan(S, c, t)
    if S.ci[L.CI_OB_BYTES, c] > 0 and S.ci[L.CI_WRITE_EV, c] == 0 and kernel_room(S, c) >= L.CELL_SIZE:
        S.ci[L.CI_WRITE_EV, c] = 1
        ev_push(S, t, L.EV_WRITE, c, 0, 0)
