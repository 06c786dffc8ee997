package tcp

import "time"

// The retransmission timeout towards the guest follows the round-trip time
// its ACKs show (RFC 6298): a guest on this host answers in microseconds,
// and a fixed first timeout of Config.AckTimeout (2 s) stalled a
// connection for that long whenever the end of a flight was lost and no
// SACK could tell. One byte at a time is timed, from the output pass that
// sent it (the first of a pass) to the ACK that covers it; never across a
// retransmission (Karn).
// Until a first sample, and as its ceiling, the timeout is AckTimeout.

// minRTO is the floor of the measured timeout (Linux's TCP_RTO_MIN): a
// guest's delayed ACK or a descheduled vCPU must not look like a loss.
const minRTO = 200 * time.Millisecond

// rtoClockGranularity is RFC 6298's G: the variation term is never less.
const rtoClockGranularity = time.Millisecond

// timeSend starts timing the byte before seq, just sent, unless one is
// being timed already.
func (f *conn) timeSend(now time.Time, seq uint32) {
	if f.rttAt.IsZero() {
		f.rttAt, f.rttSeq = now, seq
	}
}

// stopRTT drops the timing under way: what was sent again cannot be timed.
func (f *conn) stopRTT() { f.rttAt = time.Time{} }

// ackRTT takes a sample when ack covers the byte being timed.
func (f *conn) ackRTT(now time.Time, ack uint32) {
	if f.rttAt.IsZero() || seqLT(ack, f.rttSeq) {
		return
	}
	r := max(now.Sub(f.rttAt), time.Microsecond) // 0 stands for no sample
	f.rttAt = time.Time{}
	if f.srtt == 0 {
		f.srtt, f.rttvar = r, r/2
		return
	}
	d := f.srtt - r
	if d < 0 {
		d = -d
	}
	f.rttvar = (3*f.rttvar + d) / 4
	f.srtt = (7*f.srtt + r) / 8
}

// rto is f's retransmission timeout before any backoff.
func (t *Table) rto(f *conn) time.Duration {
	if f.srtt == 0 {
		return t.cfg.AckTimeout
	}
	return min(max(f.srtt+max(4*f.rttvar, rtoClockGranularity), minRTO), t.cfg.AckTimeout)
}

// ackTimeout is the ACK timeout after f.retrans retries: the RTO doubled
// per retry, capped (and safe from shift overflow with a large MaxRetrans).
func (t *Table) ackTimeout(f *conn) time.Duration {
	return backoff(t.rto(f), f.retrans)
}

// probeTimeout is the zero-window probe interval after f.retrans probes:
// AckTimeout doubled per probe, capped. A shut window is not a loss: it is
// not probed at the RTO.
func (t *Table) probeTimeout(f *conn) time.Duration {
	return backoff(t.cfg.AckTimeout, f.retrans)
}

func backoff(d time.Duration, n uint8) time.Duration {
	for i := uint8(0); i < n && d < maxAckTimeout; i++ {
		d *= 2
	}
	return min(d, maxAckTimeout)
}

// maxRetrans is how many ACK timeouts in a row reset f: Config.MaxRetrans,
// plus the doublings it takes a measured RTO to reach AckTimeout, so that
// a guest that stopped answering is given up on no sooner than with
// AckTimeout as the first timeout.
func (t *Table) maxRetrans(f *conn) int {
	n := t.cfg.MaxRetrans
	for d := t.rto(f); d < t.cfg.AckTimeout; d *= 2 {
		n++
	}
	return n
}
