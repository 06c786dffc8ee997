package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack"
	"vunet/tcpstack/stats"
	"vunet/vhostuser"
)

// Serving the stream transport as passt does: one connection at a time
// on the socket (another one arriving meanwhile is accepted and closed at
// once, passt's "discarding connection"), the next one served once it
// ends, and with --one-off (implied by --fd) the daemon leaves when the
// first one ends.

// unixAcceptor is a listening UNIX socket the stream server accepts
// connections from.
type unixAcceptor interface {
	AcceptUnix() (*net.UnixConn, error)
	Close() error
}

// serveStreamListener serves QEMU's -netdev stream connections accepted on
// l until ctx ends or, with oneOff, the first connection ends. It closes
// l when it returns.
func serveStreamListener(ctx context.Context, l unixAcceptor, stack *tcpstack.Stack, oneOff bool, log *slog.Logger) error {
	defer l.Close()
	conns := make(chan *net.UnixConn)
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				// EMFILE and friends: do not spin, do not give up.
				log.Warn("stream accept", "err", err)
				time.Sleep(100 * time.Millisecond)
				continue
			}
			select {
			case conns <- c:
			case <-ctx.Done():
				c.Close()
				return
			}
		}
	}()
	defer func() {
		l.Close()
		<-acceptDone
	}()
	var (
		ended  chan error // the session's result; nil when none runs
		reject stats.Limiter
	)
	for {
		select {
		case <-ctx.Done():
			if ended != nil {
				<-ended // ServeStream returns once ctx is done
			}
			return nil
		case c := <-conns:
			if ended != nil {
				if ok, suppressed := reject.Allow(time.Now(), time.Second); ok {
					log.Warn("stream connection rejected: a front-end is already connected",
						"pid", peerPID(c), "suppressed", suppressed)
				}
				c.Close()
				continue
			}
			ended = make(chan error, 1)
			go func(c *net.UnixConn) { ended <- serveStreamConn(ctx, c, stack, log) }(c)
		case err := <-ended:
			ended = nil
			if err != nil {
				log.Warn("stream session ended with error", "err", err)
			}
			if oneOff {
				log.Info("stream front-end left: exiting (--one-off)")
				return nil
			}
		}
	}
}

// serveStreamConn serves one connected stream socket until it ends (c is
// closed when it returns) and says who it was and how it ended.
func serveStreamConn(ctx context.Context, c *net.UnixConn, stack *tcpstack.Stack, log *slog.Logger) error {
	pid := peerPID(c)
	// The data plane takes a descriptor of its own, out of Go's poller.
	f, err := c.File()
	c.Close()
	if err != nil {
		return fmt.Errorf("stream connection: %w", err)
	}
	defer f.Close()
	log.Info("stream front-end connected", "pid", pid)
	err = stack.ServeStream(ctx, int(f.Fd()))
	if err != nil {
		return fmt.Errorf("stream front-end (pid %d) dropped: %w", pid, err)
	}
	log.Info("stream front-end left", "pid", pid)
	return nil
}

// serveStreamTransport serves the stream transport on the socket bound at
// start-up (ln: the file at --socket, or the one systemd passed) or,
// without it, on the --fd descriptor. ready is called once it accepts.
func serveStreamTransport(ctx context.Context, o *options, ln *vhostuser.Listener, stack *tcpstack.Stack, log *slog.Logger, ready func()) error {
	if ln == nil {
		return serveStreamFD(ctx, o.fd, stack, log, ready)
	}
	log.Info("stream transport listening", "socket", ln.Path(), "mode", fmt.Sprintf("%#o", uint32(o.socketMode.Perm())))
	ready()
	return serveStreamListener(ctx, ln, stack, o.oneOff, log)
}

// serveStreamFD serves an inherited, connected socket (--fd) with the
// stream transport; ready is called once it is taken.
func serveStreamFD(ctx context.Context, fd int, stack *tcpstack.Stack, log *slog.Logger, ready func()) error {
	c, err := unixConnFromFD(fd)
	if err != nil {
		return err
	}
	ready()
	return serveStreamConn(ctx, c, stack, log)
}

// peerPID is the connecting process's pid (SO_PEERCRED), -1 if unknown.
func peerPID(c *net.UnixConn) int {
	pid := -1
	if raw, err := c.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) {
			if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				pid = int(cred.Pid)
			}
		})
	}
	return pid
}
