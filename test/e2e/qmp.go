package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// QMP is a QEMU Machine Protocol client with per-command timeouts and an
// event log.
//
// It does not use github.com/digitalocean/go-qemu's qmp.SocketMonitor:
// SocketMonitor.Run hands back a slice of its bufio.Scanner's buffer, which
// the reader goroutine overwrites with the next line (an event such as
// NIC_RX_FILTER_CHANGED can arrive at any moment); it cannot time out a
// command; once Events was called, a reader that falls behind blocks command
// replies; and its package pulls in go-libvirt. Here a json.Decoder gives
// every message its own memory, events go into a slice nobody has to drain,
// and every command has a context.
type QMP struct {
	conn    net.Conn
	mu      sync.Mutex // one command in flight
	lastID  uint64     // QEMU echoes each command's id: a late reply to a timed-out command is recognised
	replies chan qmpReply

	evMu   sync.Mutex
	events []QMPEvent
	evSig  chan struct{} // closed and replaced on each event

	done    chan struct{}
	readErr error
}

// QMPEvent is an asynchronous QEMU event.
type QMPEvent struct {
	Event     string         `json:"event"`
	Data      map[string]any `json:"data"`
	Timestamp struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

type qmpCommand struct {
	Execute string `json:"execute"`
	Args    any    `json:"arguments,omitempty"`
	ID      uint64 `json:"id"`
}

type qmpReply struct {
	ID     uint64          `json:"id"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
}

// QMPError is an error answer from QEMU.
type QMPError struct{ Class, Desc string }

// Error renders the class and description QEMU gave.
func (e *QMPError) Error() string { return "qmp: " + e.Class + ": " + e.Desc }

// DialQMP connects to a QMP UNIX socket, retrying until it exists or ctx
// ends, reads the greeting and leaves capabilities negotiation mode.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	var conn net.Conn
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			conn = c
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial QMP %s: %w (last: %v)", path, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	q := &QMP{conn: conn, replies: make(chan qmpReply, 1), evSig: make(chan struct{}), done: make(chan struct{})}
	dec := json.NewDecoder(conn)
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetReadDeadline(dl)
	}
	var greeting struct {
		QMP *struct {
			Version json.RawMessage `json:"version"`
		} `json:"QMP"`
	}
	if err := dec.Decode(&greeting); err != nil || greeting.QMP == nil {
		conn.Close()
		return nil, fmt.Errorf("QMP greeting: %v", err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	go q.read(dec)
	if _, err := q.Run(ctx, "qmp_capabilities", nil); err != nil {
		q.Close()
		return nil, fmt.Errorf("qmp_capabilities: %w", err)
	}
	return q, nil
}

func (q *QMP) read(dec *json.Decoder) {
	defer close(q.done)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			q.readErr = err
			return
		}
		var probe struct {
			Event string `json:"event"`
		}
		if json.Unmarshal(raw, &probe) == nil && probe.Event != "" {
			var ev QMPEvent
			if err := json.Unmarshal(raw, &ev); err == nil {
				q.evMu.Lock()
				q.events = append(q.events, ev)
				close(q.evSig)
				q.evSig = make(chan struct{})
				q.evMu.Unlock()
			}
			continue
		}
		var r qmpReply
		if err := json.Unmarshal(raw, &r); err != nil {
			continue
		}
		select {
		case q.replies <- r:
		default: // nobody waits (its command timed out): drop it
		}
	}
}

// Run executes one command and returns its "return" value.
func (q *QMP) Run(ctx context.Context, command string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lastID++
	id := q.lastID
	c := qmpCommand{Execute: command, ID: id}
	if args != nil {
		c.Args = args
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", command, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = q.conn.SetWriteDeadline(dl)
	}
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("send %s: %w", command, err)
	}
	for {
		select {
		case r := <-q.replies:
			if r.ID != id {
				continue // answer to an earlier command that timed out
			}
			if r.Error != nil {
				return nil, fmt.Errorf("%s: %w", command, &QMPError{Class: r.Error.Class, Desc: r.Error.Desc})
			}
			return r.Return, nil
		case <-q.done:
			return nil, fmt.Errorf("%s: QMP connection closed: %v", command, q.readErr)
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w", command, ctx.Err())
		}
	}
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

// WaitEvent waits for an event named name (received at any time so far).
func (q *QMP) WaitEvent(ctx context.Context, name string) (QMPEvent, error) {
	seen := 0
	for {
		q.evMu.Lock()
		evs, sig := q.events[seen:], q.evSig
		q.evMu.Unlock()
		for _, e := range evs {
			if e.Event == name {
				return e, nil
			}
		}
		seen += len(evs)
		select {
		case <-sig:
		case <-q.done:
			return QMPEvent{}, fmt.Errorf("QMP closed before event %s", name)
		case <-ctx.Done():
			return QMPEvent{}, fmt.Errorf("event %s: %w", name, ctx.Err())
		}
	}
}

// Close closes the connection.
func (q *QMP) Close() error {
	err := q.conn.Close()
	<-q.done
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
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
