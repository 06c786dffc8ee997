package vhostuser

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"
)

// Reconnect backoff bounds for Connect.
const (
	minReconnectDelay = 100 * time.Millisecond
	maxReconnectDelay = 5 * time.Second
)

// stableSession is how long a session must have lasted for the backoff to
// start again from minReconnectDelay: a front-end that accepts and drops at
// once must not be redialled every 100ms forever. A variable for tests.
var stableSession = 5 * time.Second

// Dialer connects to the front-end's socket. ConnectWith takes one where
// the caller cannot dial the path itself (a sandboxed daemon asks a
// helper that kept the rights it started with).
type Dialer func(ctx context.Context) (*net.UnixConn, error)

// Connect dials a listening front-end (QEMU server=on) at path and serves
// it; whenever the connection fails or ends it dials again, with a delay
// doubling from 100ms up to 5s, reset after a session that handled
// messages and lasted at least 5s. It returns nil when ctx is done and
// fails only for a config that can never work.
func Connect(ctx context.Context, path string, dev DeviceConfig) error {
	if path == "" {
		return errors.New("vhost-user connect: empty socket path")
	}
	var d net.Dialer
	return ConnectWith(ctx, path, func(ctx context.Context) (*net.UnixConn, error) {
		c, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			return nil, err
		}
		return c.(*net.UnixConn), nil
	}, dev)
}

// ConnectWith is Connect with the connections made by dial; path names
// the socket in the log.
func ConnectWith(ctx context.Context, path string, dial Dialer, dev DeviceConfig) error {
	if dev.DataPlane == nil {
		return errors.New("vhost-user connect: DeviceConfig.DataPlane is nil")
	}
	if dev.stuck == nil {
		dev.stuck = newStuckPairs()
	}
	log := dev.Logger
	if log == nil {
		log = slog.Default()
	}
	log = limitLogger(log) // one limiter for every session
	dev.Logger = log
	delay := minReconnectDelay
	failures := 0
	for ctx.Err() == nil {
		grow := true
		c, err := dial(ctx)
		if err == nil {
			failures = 0
			log.Info("vhost-user connected to front-end", "socket", path)
			start := time.Now()
			handled, serr := serveSession(ctx, c, dev, nil)
			if serr != nil {
				log.Warn("vhost-user session ended with error; reconnecting", "err", serr, "retry_in", delay)
			}
			if handled > 0 && time.Since(start) >= stableSession {
				delay, grow = minReconnectDelay, false
			}
		} else if ctx.Err() == nil {
			// Say it once at Warn; a front-end that is down for long
			// would flood the log otherwise.
			level := slog.LevelDebug
			if failures == 0 {
				level = slog.LevelWarn
			}
			failures++
			log.Log(ctx, level, "vhost-user connect failed; retrying", "socket", path, "err", err, "retry_in", delay)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		if grow {
			delay = min(2*delay, maxReconnectDelay)
		}
	}
	return nil
}
