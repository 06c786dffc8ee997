package tcp

import (
	"time"

	"vunet/tcpstack/hostsock"
)

// Consuming what the guest acknowledged.
//
// Data stays in the host socket until the guest ACKs it (DESIGN invariant
// 3); an ACK that moves consumes the bytes it covers with a MSG_TRUNC
// receive. Under a QEMU guest's download that receive was the most
// expensive system call of the back-end: on loopback it also runs the
// kernel's receive-buffer clean-up, and the window update that sends the
// peer, whose next segments the same call then carries into our receive
// queue. A guest sends a few ACKs for every batch of frames it takes, and
// they reach us together, in one TX batch. So an ACK only counts its bytes
// (queueConsume); FlushSends, at the batch's end (or earlier, where a run
// of gathered guest data must go out first), consumes them in one receive
// per connection.
//
// Nothing reads a socket between the two: the output pass, the timers and
// hand-overs all run after the batch (the loop calls FlushSends at the end
// of every TX batch and every stream read, and before a stop drops the
// batch). The ACK number, the peek offset and the window state are the
// ACK's at once; only the kernel's queue lags, by one batch.

// queueConsume counts n more bytes of f's socket acknowledged by the
// guest, consumed at the end of the batch (consumeAcked).
func (t *Table) queueConsume(f *conn, n uint32) {
	if f.consumeDue == 0 {
		t.consumeQ = append(t.consumeQ, f.ref())
	}
	f.consumeDue += n
}

// flowRef names a connection beyond the moment: its slot, and the
// generation that tells a slot reused meanwhile from it (a slot's first
// generation is 1, so the zero flowRef names none).
type flowRef struct {
	slot int32
	gen  uint32
}

// ref names f.
func (f *conn) ref() flowRef { return flowRef{slot: f.slot, gen: f.gen} }

// deref is the connection r names, or nil when its slot was released
// since (and maybe reused).
func (t *Table) deref(r flowRef) *conn {
	if f := &t.flows[r.slot]; f.gen == r.gen {
		return f
	}
	return nil
}

// consumeAcked consumes from each socket what the guest acknowledged in
// the batch, and applies the window workaround to it (reopenWindow). A
// socket that cannot give back what we peeked from it is broken: the
// connection is reset.
func (t *Table) consumeAcked(now time.Time) {
	for _, r := range t.consumeQ {
		f := t.deref(r)
		if f == nil || f.consumeDue == 0 {
			continue // reset or released meanwhile
		}
		n := f.consumeDue
		f.consumeDue = 0
		if f.fd < 0 {
			continue
		}
		t.consumes++
		got, err := hostsock.Discard(f.fd, int(n))
		if err != nil || got != int(n) {
			t.log.Debug("tcp consume failed", "want", n, "got", got, "err", err)
			t.resetFlow(f, now, resetReason(err))
			continue
		}
		t.reopenWindow(f)
	}
	t.consumeQ = t.consumeQ[:0]
}
