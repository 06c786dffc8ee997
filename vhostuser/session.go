package vhostuser

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// ServeConn serves one already-connected front-end socket (passt's --fd)
// until the front-end closes it, a protocol error forces it closed, or ctx
// is done. It closes conn and releases everything the session held (rings
// stopped, memory unmapped, descriptors closed) before returning. A clean
// end (front-end hung up, ctx cancelled) returns nil.
func ServeConn(ctx context.Context, conn *net.UnixConn, dev DeviceConfig) error {
	_, err := serveSession(ctx, conn, dev, nil)
	return err
}

// serveSession runs one session and reports how many messages it handled.
// ending, if not nil, is set once the session stopped reading and starts
// its teardown.
func serveSession(ctx context.Context, conn *net.UnixConn, cfg DeviceConfig, ending *atomic.Bool) (handled int, err error) {
	if cfg.DataPlane == nil {
		conn.Close()
		return 0, errors.New("vhost-user session: DeviceConfig.DataPlane is nil")
	}
	c, err := NewConn(conn)
	if err != nil {
		conn.Close()
		return 0, err
	}
	defer c.Close()
	first, msgTimeout := cfg.FirstMessageTimeout, cfg.MessageTimeout
	if first <= 0 {
		first = DefaultFirstMessageTimeout
	}
	if msgTimeout <= 0 {
		msgTimeout = DefaultMessageTimeout
	}
	c.SetTimeouts(time.Now().Add(first), msgTimeout)
	// Faults on guest memory touched by this goroutine become panics that
	// device.process turns into a closed connection (see there).
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	d := newDevice(cfg)
	defer d.close()
	d.control = c.fd()
	d.stats.Sessions.Add(1)
	d.stats.Connected.Store(1)
	defer d.stats.Connected.Store(0)
	if ending != nil {
		defer ending.Store(true) // first of the deferred: before the teardown
	}

	// The loop sees the interrupted read fail, then notices ctx.
	stop := context.AfterFunc(ctx, c.Interrupt)
	defer stop()

	var m Message
	for {
		if err := c.ReadMessage(&m); err != nil {
			switch {
			case ctx.Err() != nil:
				d.log.Info("vhost-user session ended: shutting down", "messages", handled)
				return handled, nil
			case errors.Is(err, io.EOF):
				d.log.Info("vhost-user front-end disconnected", "messages", handled)
				return handled, nil
			case errors.Is(err, os.ErrDeadlineExceeded):
				d.stats.countError(ErrReasonTimeout)
				what := fmt.Sprintf("message not completed within %v", msgTimeout)
				if errors.Is(err, errIdle) {
					what = fmt.Sprintf("no message within %v of connecting", first)
				}
				d.log.Warn("vhost-user session closed: "+what, "messages", handled)
				return handled, fmt.Errorf("vhost-user session: %s: %w", what, err)
			}
			reason := classify(err)
			if reason == ErrReasonInvalid {
				reason = ErrReasonIO
			}
			d.stats.countError(reason)
			d.log.Error("vhost-user session closed: bad message", "err", err, "messages", handled)
			return handled, fmt.Errorf("vhost-user session: %w", err)
		}
		if handled == 0 {
			c.SetTimeouts(time.Time{}, msgTimeout)
		}
		handled++
		reply, send, perr := d.process(&m)
		if perr != nil {
			d.log.Error("vhost-user session closed: request rejected", "err", perr, "messages", handled)
			return handled, fmt.Errorf("vhost-user session: %w", perr)
		}
		if send {
			if err := c.WriteReply(m.Header.Request, reply); err != nil {
				if ctx.Err() != nil {
					return handled, nil
				}
				if errors.Is(err, os.ErrDeadlineExceeded) {
					d.stats.countError(ErrReasonTimeout)
					d.log.Warn(fmt.Sprintf("vhost-user session closed: reply not taken within %v", msgTimeout), "messages", handled)
					return handled, fmt.Errorf("vhost-user session: reply not taken within %v: %w", msgTimeout, err)
				}
				d.stats.countError(ErrReasonIO)
				d.log.Error("vhost-user session closed: reply failed", "err", err)
				return handled, fmt.Errorf("vhost-user session: %w", err)
			}
		}
	}
}
