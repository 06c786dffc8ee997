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
}

// ErrSocketInUse is returned by Serve when another process is listening on
// the socket path.
var ErrSocketInUse = errors.New("socket in use by a live listener")

// Serve listens on cfg.Path and serves front-ends one at a time: a second
// connection while one is active is closed at once and logged with its
// SO_PEERCRED credentials. Each session starts from a fresh device and is
// fully cleaned up (rings stopped, memory unmapped, descriptors closed)
// before the next one. A stale socket file (nobody listening) is replaced;
// a live one is an error (ErrSocketInUse). The socket file is removed when
// Serve returns. With cfg.Listener, Serve serves that socket instead and
// leaves its file to whoever made it. Serve returns nil when ctx is done or, with OneOff, when
// the first front-end has left.
func Serve(ctx context.Context, cfg ServerConfig, dev DeviceConfig) error {
	if cfg.Path == "" {
		return errors.New("vhost-user serve: empty socket path")
	}
	if dev.DataPlane == nil {
		return errors.New("vhost-user serve: DeviceConfig.DataPlane is nil")
	}
	mode := cfg.Mode.Perm()
	if mode == 0 {
		mode = 0o600
	}
	log := dev.Logger
	if log == nil {
		log = slog.Default()
	}
	l := cfg.Listener
	if l != nil {
		defer l.Close()
		log.Info("vhost-user listening on a passed socket", "socket", cfg.Path)
	} else {
		if err := removeStaleSocket(cfg.Path); err != nil {
			return fmt.Errorf("vhost-user serve %s: %w", cfg.Path, err)
		}
		var err error
		l, err = listenUnix(cfg.Path, mode)
		if err != nil {
			return fmt.Errorf("vhost-user serve: %w", err)
		}
		// Removal is ours: only the file we created, checked by inode, so a
		// successor that replaced it keeps its socket.
		created, _ := os.Lstat(cfg.Path)
		defer removeOurSocket(cfg.Path, created)
		defer l.Close()
		// The file was created with at most mode; the umask may have taken
		// bits away. chmod is not subject to the umask, so the mode is now
		// exactly cfg.Mode.
		if err := os.Chmod(cfg.Path, mode); err != nil {
			return fmt.Errorf("vhost-user serve: chmod %s: %w", cfg.Path, err)
		}
		log.Info("vhost-user listening", "socket", cfg.Path, "mode", fmt.Sprintf("%#o", uint32(mode)))
	}
	if cfg.Ready != nil {
		cfg.Ready()
	}

	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()

	var busy atomic.Bool
	var rejectLimit logLimiter
	var wg sync.WaitGroup
	defer wg.Wait()
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
		if !busy.CompareAndSwap(false, true) {
			rejectPeer(c, log, dev.Stats, &rejectLimit)
			continue
		}
		pid, uid, gid := peerCred(c)
		log.Info("vhost-user front-end connected", "pid", pid, "uid", uid, "gid", gid)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := serveSession(ctx, c, dev); err != nil {
				log.Warn("vhost-user session ended with error; waiting for the next front-end", "err", err)
			}
			busy.Store(false)
			if cfg.OneOff {
				l.Close()
			}
		}()
	}
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
func rejectPeer(c *net.UnixConn, log *slog.Logger, stats *Stats, limit *logLimiter) {
	stats.countError(ErrReasonRejected)
	if ok, suppressed := limit.allow(time.Now()); ok {
		pid, uid, gid := peerCred(c)
		log.Warn("vhost-user connection rejected: a front-end is already connected",
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
