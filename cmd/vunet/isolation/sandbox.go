package isolation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Config says what the sandbox must leave the daemon.
type Config struct {
	// Off skips the sandbox (--sandbox=off, a debugging aid); RunAs is
	// still honoured.
	Off bool
	// RunAs is --runas; empty means nobody when started as root.
	RunAs string
	// Metrics keeps /proc/self readable for the process collector.
	Metrics bool
	// Control allows listen(2): the control endpoint opens forwarded TCP
	// ports while the daemon runs.
	Control bool
	// Connect is the --connect socket, dialled again after the sandbox.
	Connect string
	// Remove are files created at start-up (socket, pid file) that are
	// removed at exit if they are still the ones created.
	Remove []FileID
	// Own are files created at start-up that belong to the user the
	// daemon switches to (the listening socket: its owner is whom
	// --socket-mode 0600 lets in, as when --runas switched before
	// binding).
	Own []string
	// ClosedFDs is what CloseInheritedFDs closed, for the log line.
	ClosedFDs []int
	// Logger receives the start-up line and the refusal reports.
	Logger *slog.Logger
}

// Sandbox is the applied sandbox: it dials for --connect and removes the
// start-up files at exit.
type Sandbox struct {
	cfg       Config
	keeper    *keeper // nil when off or unavailable
	closeOnce sync.Once
	closeErr  error
}

// Apply confines the daemon. Call it once, after everything the daemon
// needs from the file system and from its privileges is open (sockets,
// forwards, log, pcap, pid file) and before it serves. In order: the
// keeper starts (it needs execve and the starting user); supplementary
// groups, the capability bounding set and ambient capabilities go; every
// thread switches to the target user with no capability left;
// no_new_privs; not dumpable; Landlock; the seccomp allow-list on every
// thread. What cannot be applied (an unprivileged start, an old kernel) is
// said in the one start-up line; an explicit --runas that cannot be
// honoured is an error.
func Apply(cfg Config) (*Sandbox, error) {
	// A closed log pipe or front-end socket must not kill the daemon;
	// writes fail with EPIPE instead.
	signal.Ignore(syscall.SIGPIPE)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Sandbox{cfg: cfg}
	id, err := targetIdentity(cfg.RunAs)
	if err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 && (id.uid != 0 || id.gid != 0) && (!cfg.Off || cfg.RunAs != "") {
		for _, p := range cfg.Own {
			if err := handToUser(p, id.uid, id.gid); err != nil {
				return nil, fmt.Errorf("hand %s to user %d: %w", p, id.uid, err)
			}
		}
	}
	if cfg.Off {
		if cfg.RunAs != "" {
			if _, err := switchUserOnly(id); err != nil {
				return nil, fmt.Errorf("--runas %s: %w", cfg.RunAs, err)
			}
		}
		cfg.Logger.Warn("sandbox off (--sandbox=off, a debugging aid): vunet keeps the user, capabilities and file-system and system-call access it was started with",
			"uid", os.Geteuid())
		return s, nil
	}
	warmUp()
	pid := os.Getpid()
	var notes, keeperNotes []string

	k, err := startKeeper(keeperConfig{Remove: cfg.Remove, Connect: cfg.Connect, UID: id.uid, GID: id.gid}, cfg.Logger)
	if err != nil {
		notes = append(notes, fmt.Sprintf("no keeper (%v): misses fail with EPERM unlogged, files stay at exit, --connect redials as the dropped user", err))
	} else {
		s.keeper = k
		keeperNotes = k.ready.Notes
	}
	dropNotes, err := dropPrivileges(id)
	notes = append(notes, dropNotes...)
	for _, n := range keeperNotes {
		if !slices.Contains(dropNotes, n) { // the same limit is said once
			notes = append(notes, "keeper: "+n)
		}
	}
	if err != nil {
		s.abort()
		if cfg.RunAs != "" {
			return nil, fmt.Errorf("--runas %s: %w", cfg.RunAs, err)
		}
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if err := setNoNewPrivs(); err != nil {
		s.abort()
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if err := setNotDumpable(); err != nil {
		s.abort()
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if !capabilitiesEmpty() {
		s.abort()
		return nil, errors.New("sandbox: capabilities remain after dropping them")
	}
	// Landlock and seccomp refused by the kernel (too old, or an outer
	// system-call filter such as a systemd unit's) are said, not fatal.
	abi := landlockABI()
	if abi == 0 {
		notes = append(notes, "Landlock unavailable (kernel without it, not enabled at boot, or its calls filtered): host paths stay reachable")
	} else if err := restrictDaemonPaths(pid, cfg.Metrics); err != nil {
		notes = append(notes, fmt.Sprintf("Landlock not applied (%v): host paths stay reachable", err))
		abi = 0
	}
	// The line's values are taken now: the filter refuses getuid and
	// friends.
	attrs := []any{"user", id.name, "uid", os.Geteuid(), "gid", os.Getegid(), "capabilities", "none",
		"no_new_privs", true, "dumpable", false}
	pol := policy(filterSpec{role: roleDaemon, pid: pid, metrics: cfg.Metrics, control: cfg.Control})
	if _, err := program(pol, true); err != nil {
		s.abort()
		return nil, fmt.Errorf("sandbox: %w", err) // our list is wrong: a bug
	}
	listener, filtered := -1, seccompSupported()
	if !filtered {
		notes = append(notes, "no seccomp allow-list for "+runtime.GOARCH+": system calls not restricted")
	} else {
		listener, err = installFilter(pol, s.keeper != nil)
		if errors.Is(err, errNoListener) {
			notes = append(notes, "seccomp user notification unavailable (kernel before 5.7): misses fail with EPERM unlogged")
			listener, err = installFilter(pol, false)
		}
		if err != nil {
			notes = append(notes, fmt.Sprintf("seccomp filter not installed (%v): system calls not restricted", err))
			listener, filtered = -1, false
		}
	}
	if listener >= 0 {
		if err := s.keeper.send(opListener, nil, listener); err != nil {
			notes = append(notes, fmt.Sprintf("keeper did not take the seccomp listener (%v): misses fail with ENOSYS unlogged", err))
		}
		syscall.Close(listener)
	}

	allowed := 0 // no filter
	if filtered {
		allowed = len(allowedSyscalls(pol))
	}
	attrs = append(attrs, "seccomp_allowed_syscalls", allowed, "landlock_abi", abi,
		"inherited_fds_closed", len(cfg.ClosedFDs))
	if s.keeper != nil {
		attrs = append(attrs, "keeper_pid", s.keeper.pid(), "keeper_uid", s.keeper.ready.UID)
	}
	if len(notes) > 0 {
		attrs = append(attrs, "not_applied", strings.Join(notes, "; "))
		cfg.Logger.Warn("sandbox applied in part", attrs...)
	} else {
		cfg.Logger.Info("sandbox applied", attrs...)
	}
	if os.Getenv(SelfCheckEnv) != "" {
		selfCheck(cfg.Logger)
	}
	return s, nil
}

// warmUp does, before the sandbox, what the Go runtime and standard
// library would otherwise do lazily by reading files later: the local
// time zone (log time stamps) is loaded on first use.
func warmUp() {
	_, _ = time.Now().Local().Zone()
}

// abort stops a keeper started for a sandbox that failed.
func (s *Sandbox) abort() {
	if s.keeper != nil {
		s.keeper.close()
		s.keeper.conn.Close()
		s.keeper = nil
	}
}

// Dial connects to the --connect socket: through the keeper once the
// sandbox is up (the daemon may no longer reach the path), directly
// otherwise.
func (s *Sandbox) Dial(ctx context.Context) (*net.UnixConn, error) {
	if s.keeper != nil {
		return s.keeper.dial(ctx)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", s.cfg.Connect)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// RemovesFiles reports whether a keeper removes the start-up files at
// exit (the daemon itself need not, and may not be allowed to).
func (s *Sandbox) RemovesFiles() bool { return s.keeper != nil }

// Close removes the start-up files that are still the daemon's: through
// the keeper when there is one, else directly (which a dropped user may
// not be allowed to do). It is for the exit; a second call returns the
// first one's result at once.
func (s *Sandbox) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Sandbox) close() error {
	if s.keeper != nil {
		err := s.keeper.cleanup()
		s.keeper.close()
		if err != nil {
			return fmt.Errorf("remove files at exit: %w", err)
		}
		return nil
	}
	var failed []string
	for _, f := range s.cfg.Remove {
		if err := removeIfSame(f); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", f.Path, err))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("remove files at exit: %s", strings.Join(failed, "; "))
	}
	return nil
}

// switchUserOnly is --runas with the sandbox off: the user switch and
// nothing else, as before the sandbox existed.
func switchUserOnly(id identity) (bool, error) {
	if id.uid == os.Geteuid() && id.gid == os.Getegid() {
		return false, nil
	}
	if err := syscall.Setgroups(nil); err != nil && !errors.Is(err, syscall.EPERM) {
		return false, fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(id.gid, id.gid, id.gid); err != nil {
		return false, fmt.Errorf("setgid %d: %w", id.gid, err)
	}
	if err := syscall.Setresuid(id.uid, id.uid, id.uid); err != nil {
		return false, fmt.Errorf("setuid %d: %w", id.uid, err)
	}
	return true, nil
}

// handToUser gives the socket file at path to uid:gid. Root does this by
// path, so the path is opened without following a link and changed
// through that descriptor only if it is a socket: whoever may write the
// directory could have put a hard link to a root-owned file there (or a
// symbolic link), which must keep its owner.
func handToUser(path string, uid, gid int) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("not a socket any more (mode %#o)", st.Mode)
	}
	return unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH)
}
