package vhostuser

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ServerConfig configures Serve.
type ServerConfig struct {
	Path   string      // socket path
	Mode   os.FileMode // socket file permissions; 0 means 0600
	OneOff bool        // return after the first front-end leaves
	// Ready, when set, is called once the socket accepts connections
	// (a daemon reports its start-up complete then).
	Ready func()
	// Listener, when set, is a socket already listening at Path that
	// someone else made (systemd socket activation): Serve serves it and
	// leaves its file alone (no stale-file check, chmod or removal; Mode
	// is unused). Serve closes it when it returns.
	Listener *net.UnixListener
	// TeardownWait bounds how long a front-end that connects while the
	// previous session is ending waits for it (0: DefaultTeardownWait).
	TeardownWait time.Duration
}

// ErrSocketInUse is returned by Serve when another process is listening on
// the socket path.
var ErrSocketInUse = errors.New("socket in use by a live listener")

// Serve listens on cfg.Path and serves front-ends one at a time: a second
// connection while one is active is closed at once and logged with its
// SO_PEERCRED credentials, unless the active session is ending, in which
// case it waits for the teardown (see frontendSlot). Each session starts
// from a fresh device and is fully cleaned up (rings stopped, memory
// unmapped, descriptors closed) before the next one. A stale socket file
// (nobody listening) is replaced; a live one is an error (ErrSocketInUse).
// The socket file is removed when Serve returns. With cfg.Listener, Serve
// serves that socket instead and leaves its file to whoever made it. Serve
// returns nil when ctx is done or, with OneOff, when the first front-end
// has left.
func Serve(ctx context.Context, cfg ServerConfig, dev DeviceConfig) error {
	if dev.DataPlane == nil {
		return errors.New("vhost-user serve: DeviceConfig.DataPlane is nil")
	}
	l, err := Listen(cfg)
	if err != nil {
		return err
	}
	return l.Serve(ctx, dev)
}

// Listener is a bound vhost-user socket that has not served yet: the
// daemon binds it before it drops its privileges, then serves.
type Listener struct {
	cfg     ServerConfig
	mode    os.FileMode
	l       *net.UnixListener
	created fs.FileInfo
	leave   atomic.Bool
}

// Listen creates the socket file of cfg (replacing a stale one) and
// listens on it, or takes cfg.Listener; Serve serves it. The caller must
// call Serve or Close.
func Listen(cfg ServerConfig) (*Listener, error) {
	if cfg.Path == "" {
		return nil, errors.New("vhost-user serve: empty socket path")
	}
	mode := cfg.Mode.Perm()
	if mode == 0 {
		mode = 0o600
	}
	if cfg.Listener != nil {
		// systemd's socket: its file is not ours to check, chmod or
		// remove.
		ln := &Listener{cfg: cfg, mode: mode, l: cfg.Listener}
		ln.leave.Store(true)
		return ln, nil
	}
	if err := removeStaleSocket(cfg.Path); err != nil {
		return nil, fmt.Errorf("vhost-user serve %s: %w", cfg.Path, err)
	}
	l, err := listenUnix(cfg.Path, mode)
	if err != nil {
		return nil, fmt.Errorf("vhost-user serve: %w", err)
	}
	// Removal is ours: only the file we created, checked by inode, so a
	// successor that replaced it keeps its socket.
	created, _ := os.Lstat(cfg.Path)
	ln := &Listener{cfg: cfg, mode: mode, l: l, created: created}
	// The file was created with at most mode; the umask may have taken
	// bits away. chmod is not subject to the umask, so the mode is now
	// exactly cfg.Mode.
	if err := os.Chmod(cfg.Path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("vhost-user serve: chmod %s: %w", cfg.Path, err)
	}
	return ln, nil
}

// Path is the socket file's path.
func (ln *Listener) Path() string { return ln.cfg.Path }

// AcceptUnix accepts the next connection, for a server of another
// protocol on the same kind of socket (vunet's stream transport) that
// uses the listener instead of Serve.
func (ln *Listener) AcceptUnix() (*net.UnixConn, error) { return ln.l.AcceptUnix() }

// LeaveFile makes Close leave the socket file for someone else to remove
// (a sandboxed daemon's helper that kept the rights to).
func (ln *Listener) LeaveFile() { ln.leave.Store(true) }

// Close stops listening and removes the socket file if it is still ours,
// unless LeaveFile was called (or the socket was passed in).
func (ln *Listener) Close() error {
	err := ln.l.Close()
	if !ln.leave.Load() {
		removeOurSocket(ln.cfg.Path, ln.created)
	}
	return err
}

// Serve serves front-ends on the listener as the package's Serve does,
// calls cfg.Ready once it accepts, and closes it when it returns.
func (ln *Listener) Serve(ctx context.Context, dev DeviceConfig) error {
	if dev.DataPlane == nil {
		ln.Close()
		return errors.New("vhost-user serve: DeviceConfig.DataPlane is nil")
	}
	defer ln.Close()
	if dev.stuck == nil {
		dev.stuck = newStuckPairs()
	}
	cfg, mode, l := ln.cfg, ln.mode, ln.l
	log := dev.Logger
	if log == nil {
		log = slog.Default()
	}
	// One line limiter for every session: a front-end that reconnects
	// again and again does not get a fresh burst each time.
	log = limitLogger(log)
	dev.Logger = log
	if cfg.Listener != nil {
		log.Info("vhost-user listening on a passed socket", "socket", cfg.Path)
	} else {
		log.Info("vhost-user listening", "socket", cfg.Path, "mode", fmt.Sprintf("%#o", uint32(mode)))
	}
	if cfg.Ready != nil {
		cfg.Ready()
	}

	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()

	slot := &frontendSlot{ctx: ctx, cfg: cfg, dev: dev, log: log, listener: l}
	defer slot.wg.Wait()
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// EMFILE and friends: do not spin, do not give up.
			log.Warn("vhost-user accept", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		slot.offer(c)
	}
}

// DefaultTeardownWait bounds how long a new front-end waits for the
// previous session's teardown (ServerConfig.TeardownWait).
const DefaultTeardownWait = 10 * time.Second

// frontendSlot is Serve's one front-end at a time. A connection that
// arrives while a session runs is turned away, unless that session is
// ending (its front-end hung up; the rings are being stopped and the
// memory unmapped): QEMU restarted at once reconnects in that window, and
// is then held, unanswered, until the teardown is over (bounded by
// TeardownWait). One connection waits at most; others are turned away.
type frontendSlot struct {
	ctx      context.Context
	cfg      ServerConfig
	dev      DeviceConfig
	log      *slog.Logger
	listener *net.UnixListener
	wg       sync.WaitGroup

	mu      sync.Mutex
	active  *liveSession // nil: free
	waiting bool
	reject  logLimiter // used by the accept goroutine only
}

// liveSession is the state of the front-end being served.
type liveSession struct {
	conn   *net.UnixConn
	ending atomic.Bool   // set by serveSession once it stopped reading
	done   chan struct{} // closed when the teardown is over
}

// offer serves, queues or turns away a new connection.
func (s *frontendSlot) offer(c *net.UnixConn) {
	s.mu.Lock()
	switch {
	case s.active == nil && !s.waiting: // a waiting connection goes first
		a := s.beginLocked(c)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.run(a)
	case !s.waiting && !s.cfg.OneOff && (s.active.ending.Load() || peerHungUp(s.active.conn)):
		s.waiting = true
		prev := s.active
		s.mu.Unlock()
		s.wg.Add(1)
		go s.await(prev, c)
	default:
		s.mu.Unlock()
		rejectPeer(c, s.log, s.dev.Stats, &s.reject, "a front-end is already connected")
	}
}

func (s *frontendSlot) beginLocked(c *net.UnixConn) *liveSession {
	a := &liveSession{conn: c, done: make(chan struct{})}
	s.active = a
	pid, uid, gid := peerCred(c)
	s.log.Info("vhost-user front-end connected", "pid", pid, "uid", uid, "gid", gid)
	return a
}

// await holds c until prev's teardown is over, then serves it.
func (s *frontendSlot) await(prev *liveSession, c *net.UnixConn) {
	defer s.wg.Done()
	wait := s.cfg.TeardownWait
	if wait <= 0 {
		wait = DefaultTeardownWait
	}
	start := time.Now()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-prev.done:
	case <-t.C:
	case <-s.ctx.Done():
	}
	s.mu.Lock()
	s.waiting = false
	if s.active != nil || s.ctx.Err() != nil {
		s.mu.Unlock()
		var lim logLimiter // its own line: this is rare and worth seeing
		rejectPeer(c, s.log, s.dev.Stats, &lim, "the previous front-end's session did not end in time")
		return
	}
	a := s.beginLocked(c)
	s.mu.Unlock()
	s.log.Info("vhost-user front-end waited for the previous session's teardown", "waited", time.Since(start).Round(time.Millisecond))
	s.wg.Add(1)
	s.run(a)
}

// run serves one session and frees the slot.
func (s *frontendSlot) run(a *liveSession) {
	defer s.wg.Done()
	if _, err := serveSession(s.ctx, a.conn, s.dev, &a.ending); err != nil {
		s.log.Warn("vhost-user session ended with error; waiting for the next front-end", "err", err)
	}
	s.mu.Lock()
	s.active = nil
	close(a.done)
	s.mu.Unlock()
	if s.cfg.OneOff {
		s.listener.Close()
	}
}

// peerHungUp reports whether c's peer closed its end (a session that has
// not noticed yet is about to end).
func peerHungUp(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return true
	}
	hup := false
	if cerr := raw.Control(func(fd uintptr) {
		p := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(p[:], 0); err == nil && n > 0 {
			hup = p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
		}
	}); cerr != nil {
		return true
	}
	return hup
}

// listenUnix listens on a new socket file at path whose permissions are
// never wider than mode, not even for a moment: Linux creates the file of
// bind(2) with the socket inode's mode minus the umask, and fchmod on the
// socket before bind sets that mode (a chmod after bind would leave a
// window where anyone the umask allows can connect and be served). The
// listener does not unlink the file on Close.
func listenUnix(path string, mode os.FileMode) (*net.UnixListener, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close() // FileListener holds its own descriptor
	if err := unix.Fchmod(fd, uint32(mode.Perm())); err != nil {
		return nil, fmt.Errorf("fchmod socket for %s: %w", path, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return nil, fmt.Errorf("bind %s: %w", path, err)
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	fl, err := net.FileListener(f)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	l := fl.(*net.UnixListener)
	l.SetUnlinkOnClose(false)
	return l, nil
}

// rejectPeer turns away a connection that arrived while a front-end is
// being served (vhost-user is one front-end per back-end socket).
// The warning is rate-limited: anyone who can connect can repeat it.
func rejectPeer(c *net.UnixConn, log *slog.Logger, stats *Stats, limit *logLimiter, why string) {
	stats.countError(ErrReasonRejected)
	if ok, suppressed := limit.allow(time.Now()); ok {
		pid, uid, gid := peerCred(c)
		log.Warn("vhost-user connection rejected: "+why,
			"pid", pid, "uid", uid, "gid", gid, "suppressed", suppressed)
	}
	c.Close()
}

// peerCred returns the connecting process's SO_PEERCRED (-1s if unknown).
func peerCred(c *net.UnixConn) (pid, uid, gid int) {
	pid, uid, gid = -1, -1, -1
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err == nil {
			pid, uid, gid = int(cred.Pid), int(cred.Uid), int(cred.Gid)
		}
	})
	return
}

// removeStaleSocket removes a socket file nobody listens on (left behind by
// a crashed back-end). A live listener, or a path that is not a socket, is
// left alone and reported.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("exists and is not a socket (mode %v)", fi.Mode())
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return ErrSocketInUse
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("probe existing socket: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}

func removeOurSocket(path string, created fs.FileInfo) {
	if created == nil {
		return
	}
	now, err := os.Lstat(path)
	if err != nil || !os.SameFile(now, created) {
		return
	}
	os.Remove(path)
}
