package tcp

import (
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// Connection slots: a connection lives in a slot of Table.flows, found by
// its key (byKey) or its epoll token (slot and generation, so a stale
// token of a reused slot finds nothing); alloc takes one, release and
// handedOff give it back.

func (t *Table) token(f *conn) hostsock.Token {
	return hostsock.NewToken(hostsock.OwnerTCP, f.gen, uint32(f.slot))
}

// flowByToken resolves an epoll token; nil for a stale one.
func (t *Table) flowByToken(tok hostsock.Token) *conn {
	slot := tok.Slot()
	if int(slot) >= len(t.flows) {
		return nil
	}
	f := &t.flows[slot]
	if f.state == stats.TCPFree || f.gen&hostsock.GenMask != tok.Gen() {
		return nil
	}
	return f
}

func (t *Table) setState(f *conn, s stats.TCPState) {
	if f.state == s {
		return
	}
	if f.state != stats.TCPFree {
		t.stats.ConnsByState[f.state].Add(-1)
	}
	if s != stats.TCPFree {
		t.stats.ConnsByState[s].Add(1)
	}
	f.state = s
}

// alloc takes a free slot for key; nil when the table is full.
func (t *Table) alloc(key connKey) *conn {
	if len(t.free) == 0 {
		return nil
	}
	s := t.free[len(t.free)-1]
	t.free = t.free[:len(t.free)-1]
	f := &t.flows[s]
	gen := f.gen + 1
	*f = conn{key: key, fd: -1, slot: s, gen: gen, nextOut: -1}
	if t.dir != nil {
		f.fp = keySum(t.dir, &key)
		t.dir.Add(f.fp)
	}
	t.byKey[key] = s
	t.active = append(t.active, s)
	t.qstats.Flows.Live[stats.FlowTCP].Add(1)
	return f
}

// release returns f's slot. The socket must be closed already, and f must
// not be in the output list (output passes skip free slots anyway).
func (t *Table) release(f *conn) {
	if f.state == stats.TCPFree {
		return
	}
	t.qstats.Flows.Closed[stats.FlowTCP].Add(1)
	t.freeSlot(f)
}

// handedOff returns the slot of a connection another table took over,
// counted as moved out.
func (t *Table) handedOff(f *conn) {
	if f.state == stats.TCPFree {
		return
	}
	t.qstats.Flows.MovedOut[stats.FlowTCP].Add(1)
	t.freeSlot(f)
}

// freeSlot is release without the count.
func (t *Table) freeSlot(f *conn) {
	t.flowGone(f)
	if s, ok := t.byKey[f.key]; ok && s == f.slot {
		delete(t.byKey, f.key)
	}
	if t.dir != nil {
		t.dir.Remove(f.fp)
	}
	f.fp = 0
	t.oooDrop(f)
	for i, s := range t.active {
		if s == f.slot {
			last := len(t.active) - 1
			t.active[i] = t.active[last]
			t.active = t.active[:last]
			break
		}
	}
	t.clearStalled(f)
	t.setState(f, stats.TCPFree)
	t.qstats.Flows.Live[stats.FlowTCP].Add(-1)
	f.gen++
	if f.flags&flDirty == 0 {
		t.free = append(t.free, f.slot)
	}
	// A dirty flow's slot is returned when the output pass unlinks it, so
	// the list never points at a reused slot.
}
