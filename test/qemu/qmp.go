package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// QMP is a thin wrapper over github.com/digitalocean/go-qemu's
// qmp.SocketMonitor that adds what the tests need and the monitor lacks:
//
//   - Timeouts. SocketMonitor.Connect and Run block until QEMU answers;
//     here both run under a context, and a command that times out
//     disconnects the monitor (the blocked Run then returns, and a late
//     reply cannot be taken for the next command's).
//   - Private reply memory. SocketMonitor's reader hands each reply to Run
//     as a slice of its bufio.Scanner buffer and goes on scanning: the next
//     line QEMU sends (an event such as NIC_RX_FILTER_CHANGED can come at any
//     moment) overwrites the reply, even while Run itself still decodes it
//     (a data race that TestQMPClient reproduces). The monitor therefore
//     talks to QEMU through a replyGate, which holds back everything after a
//     reply until Run's result has been copied.
//   - Event draining. The monitor's reader blocks on an unbuffered channel
//     for every event once Events was called, and command replies queue
//     behind it: a goroutine drains the channel into a log that WaitEvent
//     and Events read.
//
// Commands carry a string id, which QEMU echoes: a reply whose id is not
// the command's is reported, not silently used.
type QMP struct {
	mon  *qmp.SocketMonitor
	gate *replyGate

	mu     sync.Mutex // one command in flight (the monitor serialises too; this guards lastID and broken)
	lastID uint64
	broken error // set when a command timed out and the monitor was disconnected

	evMu   sync.Mutex
	events []QMPEvent
	evSig  chan struct{} // closed and replaced on each event
	evDone chan struct{} // closed when the monitor's event channel closes

	closeOnce sync.Once
	closeErr  error
}

// QMPEvent is an asynchronous QEMU event as go-qemu decodes it.
type QMPEvent = qmp.Event

// QMPError is an error answer from QEMU. go-qemu keeps only the
// description ("desc") of QEMU's error object.
type QMPError struct{ Command, Desc string }

// Error names the command and what QEMU said.
func (e *QMPError) Error() string { return "qmp " + e.Command + ": " + e.Desc }

// DialQMP connects to a QMP UNIX socket, retrying until it accepts or ctx
// ends (QEMU creates it some time after it starts), reads the greeting and
// leaves capabilities negotiation mode.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	var upstream net.Conn
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			upstream = c
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial QMP %s: %w (last: %v)", path, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	g, err := newReplyGate(upstream)
	if err != nil {
		upstream.Close()
		return nil, err
	}
	mon, err := qmp.NewSocketMonitor("unix", g.addr, 5*time.Second)
	if err != nil {
		g.close()
		return nil, fmt.Errorf("dial QMP gate for %s: %w", path, err)
	}
	// Connect reads the greeting and answers qmp_capabilities with no
	// deadline of its own: a QEMU that never greets must not hang the test.
	connected := make(chan error, 1)
	go func() { connected <- mon.Connect() }()
	select {
	case err := <-connected:
		if err != nil {
			_ = mon.Disconnect()
			g.close()
			return nil, fmt.Errorf("QMP handshake on %s: %w", path, err)
		}
	case <-ctx.Done():
		_ = mon.Disconnect() // unblocks Connect
		g.close()
		<-connected
		return nil, fmt.Errorf("QMP handshake on %s: %w", path, ctx.Err())
	}
	evs, err := mon.Events(context.Background())
	if err != nil {
		_ = mon.Disconnect()
		g.close()
		return nil, fmt.Errorf("QMP events on %s: %w", path, err)
	}
	q := &QMP{mon: mon, gate: g, evSig: make(chan struct{}), evDone: make(chan struct{})}
	go q.drain(evs)
	return q, nil
}

// drain keeps the monitor's reader moving: it blocks on every event until
// somebody takes it, and replies wait behind events.
func (q *QMP) drain(evs <-chan qmp.Event) {
	defer close(q.evDone)
	for ev := range evs {
		q.evMu.Lock()
		q.events = append(q.events, ev)
		close(q.evSig)
		q.evSig = make(chan struct{})
		q.evMu.Unlock()
	}
}

type qmpCommand struct {
	Execute string `json:"execute"`
	Args    any    `json:"arguments,omitempty"`
	// ID is a string: go-qemu decodes replies' "id" into a string field,
	// so a numeric id would make every reply fail to decode.
	ID string `json:"id"`
}

type qmpReply struct {
	ID     string          `json:"id"`
	Return json.RawMessage `json:"return"`
}

// Run executes one command and returns a private copy of its "return"
// value. A command still unanswered when ctx ends disconnects the monitor:
// every later command fails at once with the reason.
func (q *QMP) Run(ctx context.Context, command string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.broken != nil {
		return nil, fmt.Errorf("%s: %w", command, q.broken)
	}
	q.lastID++
	id := "vunet-e2e-" + strconv.FormatUint(q.lastID, 10)
	b, err := json.Marshal(qmpCommand{Execute: command, Args: args, ID: id})
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", command, err)
	}
	b = append(b, '\n') // QEMU does not need it; line-based peers (and logs) do
	type result struct {
		raw []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := q.mon.Run(b)
		// Copy before the gate lets the next line reach the reader,
		// which scans it into the same buffer.
		raw := append([]byte(nil), out...)
		q.gate.consumed()
		done <- result{raw: raw, err: err}
	}()
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		q.broken = fmt.Errorf("QMP disconnected after %s timed out: %w", command, ctx.Err())
		_ = q.mon.Disconnect()
		q.gate.close()
		<-done
		return nil, fmt.Errorf("%s: %w", command, ctx.Err())
	}
	if res.err != nil {
		if res.raw == nil && isQEMUError(res.err) {
			return nil, &QMPError{Command: command, Desc: res.err.Error()}
		}
		return nil, fmt.Errorf("%s: %w", command, res.err)
	}
	var r qmpReply
	if err := json.Unmarshal(res.raw, &r); err != nil {
		return nil, fmt.Errorf("decode %s reply %q: %w", command, res.raw, err)
	}
	if r.ID != id {
		return nil, fmt.Errorf("%s: reply carries id %q, want %q: %s", command, r.ID, id, res.raw)
	}
	return r.Return, nil
}

// isQEMUError tells QEMU's error answers (go-qemu turns their "desc" into
// a plain errors.New) from transport failures: socket errors, end of
// stream, and the empty reply a disconnected monitor hands back.
func isQEMUError(err error) bool {
	var ne net.Error
	var se *json.SyntaxError
	return !errors.As(err, &ne) && !errors.As(err, &se) && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed)
}

// RunInto runs a command and decodes its return value into out.
func (q *QMP) RunInto(ctx context.Context, command string, args, out any) error {
	raw, err := q.Run(ctx, command, args)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("decode %s reply %s: %w", command, raw, err)
	}
	return nil
}

// Events returns the events received so far.
func (q *QMP) Events() []QMPEvent {
	q.evMu.Lock()
	defer q.evMu.Unlock()
	return append([]QMPEvent(nil), q.events...)
}

// WaitEvent waits for an event named name (received at any time so far)
// for which match, when not nil, holds.
func (q *QMP) WaitEvent(ctx context.Context, name string, match func(QMPEvent) bool) (QMPEvent, error) {
	seen := 0
	for {
		q.evMu.Lock()
		evs, sig := q.events[seen:], q.evSig
		q.evMu.Unlock()
		for _, e := range evs {
			if e.Event == name && (match == nil || match(e)) {
				return e, nil
			}
		}
		seen += len(evs)
		select {
		case <-sig:
		case <-q.evDone:
			return QMPEvent{}, fmt.Errorf("QMP closed before event %s", name)
		case <-ctx.Done():
			return QMPEvent{}, fmt.Errorf("event %s: %w", name, ctx.Err())
		}
	}
}

// Close disconnects the monitor and waits for its reader to stop.
func (q *QMP) Close() error {
	q.closeOnce.Do(func() {
		q.closeErr = q.mon.Disconnect()
		q.gate.close()
		<-q.evDone
	})
	return q.closeErr
}

// Status is query-status's answer.
type Status struct {
	Running bool   `json:"running"`
	Status  string `json:"status"`
}

// QueryStatus returns the VM's run state.
func (q *QMP) QueryStatus(ctx context.Context) (Status, error) {
	var s Status
	err := q.RunInto(ctx, "query-status", nil, &s)
	return s, err
}

// RxFilter is the part of query-rx-filter's answer the tests look at.
type RxFilter struct {
	Name             string `json:"name"`
	MainMAC          string `json:"main-mac"`
	Promiscuous      bool   `json:"promiscuous"`
	BroadcastAllowed bool   `json:"broadcast-allowed"`
	Unicast          string `json:"unicast"`
	Multicast        string `json:"multicast"`
}

// QueryRxFilter returns the rx-filter state of NIC id (the -device id).
func (q *QMP) QueryRxFilter(ctx context.Context, id string) (RxFilter, error) {
	var out []RxFilter
	if err := q.RunInto(ctx, "query-rx-filter", map[string]any{"name": id}, &out); err != nil {
		return RxFilter{}, err
	}
	if len(out) != 1 {
		return RxFilter{}, fmt.Errorf("query-rx-filter %s: %d answers", id, len(out))
	}
	return out[0], nil
}
