package isolation

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The keeper is a second, small process (the vunet binary re-executed
// before the sandbox) that does for the confined daemon the few things
// the daemon can no longer do itself:
//
//   - answer the daemon's seccomp misses (SECCOMP_RET_USER_NOTIF) with
//     EPERM and report each to the daemon, which logs it once. Go cannot
//     catch SIGSYS (SECCOMP_RET_TRAP crashes the runtime), a bare
//     SECCOMP_RET_ERRNO tells nobody which call failed, and an answering
//     thread inside the daemon could deadlock on a runtime lock held by
//     the very thread it must answer. A separate process answers whatever
//     state the daemon's runtime is in.
//   - remove the daemon's socket and pid file when it exits, even after
//     the daemon dropped to a user that may not write their directories
//     (a crash or SIGKILL included: the control socket closes then).
//   - connect to the --connect socket again when the front-end comes
//     back, with the rights the daemon had at start-up.
//
// The keeper keeps the user vunet was started as (root or not) only when
// it has files to remove or a socket to dial, and never a capability. It
// confines itself like the daemon: no_new_privs, not dumpable, Landlock
// limited to removing files in those directories (and connecting there),
// and a seccomp allow-list without open, exec or any other file access,
// and without socket and connect unless it dials --connect.
// It acts only on the paths it was given at start; the daemon's later
// messages carry no paths.

// KeeperRequested reports whether this process was started as a keeper.
// main calls RunKeeper then, before anything else.
func KeeperRequested() bool { return os.Getenv(keeperEnv) != "" }

// RunKeeper runs the keeper until its daemon exits and returns the exit
// code.
func RunKeeper() int {
	fd, err := strconv.Atoi(os.Getenv(keeperEnv))
	if err != nil || fd < 3 {
		fmt.Fprintf(os.Stderr, "vunet keeper: bad %s\n", keeperEnv)
		return 2
	}
	os.Unsetenv(keeperEnv)
	// The keeper shares the daemon's process group and control group, so
	// a stop aimed at all of them (systemd's KillMode=control-group, a
	// terminal's Ctrl-C, timeout(1)) reaches it too, at the same moment:
	// it would die before removing the daemon's files. Its life is the
	// daemon's instead: it exits when the control socket closes, SIGKILL
	// of the daemon included.
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	k := &keeperProc{ctrl: fd, notif: -1}
	if err := k.start(); err != nil {
		_ = sendMsg(fd, opFailed, []byte(err.Error()), -1, 0)
		return 1
	}
	k.loop()
	return 0
}

// keeperProc is the keeper's state.
type keeperProc struct {
	ctrl  int // control socket to the daemon
	notif int // seccomp notification descriptor, -1 until received
	cfg   keeperConfig
}

// start reads the configuration and confines the keeper.
func (k *keeperProc) start() error {
	buf := make([]byte, 64<<10)
	op, payload, fd, err := recvMsg(k.ctrl, buf)
	if fd >= 0 {
		unix.Close(fd)
	}
	if err != nil {
		return err
	}
	if op != opConfig {
		return fmt.Errorf("first message %q, want configuration", op)
	}
	if err := json.Unmarshal(payload, &k.cfg); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&[]byte("vunet-keeper\x00")[0])), 0, 0, 0)
	id := identity{uid: os.Geteuid(), gid: os.Getegid()}
	if len(k.cfg.Remove) == 0 && k.cfg.Connect == "" {
		id = identity{uid: k.cfg.UID, gid: k.cfg.GID}
	}
	notes, err := dropPrivileges(id)
	if err != nil {
		return err
	}
	if err := setNoNewPrivs(); err != nil {
		return err
	}
	if err := setNotDumpable(); err != nil {
		return err
	}
	var paths []string
	for _, f := range k.cfg.Remove {
		paths = append(paths, f.Path)
	}
	if landlockABI() == 0 {
		notes = append(notes, "Landlock unavailable: file system not restricted by it")
	} else if err := restrictKeeperPaths(paths, k.cfg.Connect); err != nil {
		return err
	}
	ready, _ := json.Marshal(keeperReady{UID: os.Geteuid(), Notes: notes}) // getuid is refused next
	if seccompSupported() {
		if _, err := installFilter(policy(filterSpec{role: roleKeeper, pid: os.Getpid(), dial: k.cfg.Connect != ""}), false); err != nil {
			return err
		}
	}
	return sendMsg(k.ctrl, opReady, ready, -1, 0)
}

// loop serves the daemon until it closes the control socket, then
// removes its files. Filter misses are answered on their own goroutine:
// SECCOMP_IOCTL_NOTIF_RECV blocks when the notification that made the
// descriptor readable was withdrawn meanwhile (the refused thread took a
// signal), and must never hold up a dial or the clean-up.
func (k *keeperProc) loop() {
	buf := make([]byte, 4096)
	for {
		op, _, fd, err := recvMsg(k.ctrl, buf)
		if err != nil {
			break
		}
		switch op {
		case opListener:
			if fd >= 0 && k.notif < 0 {
				k.notif = fd
				go k.answerLoop(fd)
			} else if fd >= 0 {
				unix.Close(fd)
			}
		case opDial:
			k.dial()
		case opCleanup:
			_ = sendMsg(k.ctrl, opCleanedUp, []byte(k.cleanup()), -1, 0)
		default:
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}
	k.cleanup()
}

// answerLoop answers filter misses until the daemon's filter is gone.
func (k *keeperProc) answerLoop(notif int) {
	for {
		if err := k.answer(notif); err != nil {
			return
		}
	}
}

// seccompNotif is struct seccomp_notif (linux/seccomp.h).
type seccompNotif struct {
	id    uint64
	pid   uint32
	flags uint32
	nr    int32
	arch  uint32
	ip    uint64
	args  [6]uint64
}

// seccompNotifResp is struct seccomp_notif_resp.
type seccompNotifResp struct {
	id    uint64
	val   int64
	error int32
	flags uint32
}

// answer waits for one filter miss, refuses it with EPERM, then reports
// it: the refused thread is released before anything else happens. It
// fails only when the descriptor is useless (the filter has no tasks
// left, or it is not a listener).
func (k *keeperProc) answer(notif int) error {
	var n seccompNotif
	if _, _, e := syscall.Syscall(unix.SYS_IOCTL, uintptr(notif), ioctlNotifRecv, uintptr(unsafe.Pointer(&n))); e != 0 {
		switch e {
		case unix.EINTR, unix.ENOENT:
			return nil // interrupted, or the thread went away
		}
		return e
	}
	resp := seccompNotifResp{id: n.id, error: -int32(unix.EPERM)}
	_, _, _ = syscall.Syscall(unix.SYS_IOCTL, uintptr(notif), ioctlNotifSend, uintptr(unsafe.Pointer(&resp)))
	_ = sendMsg(k.ctrl, opRefused, refusal(n.nr, n.arch), -1, unix.MSG_DONTWAIT)
	return nil
}

// dial connects to the --connect socket and hands the connection over.
// The socket is non-blocking so that a front-end with a full backlog
// cannot stall the keeper (the daemon retries).
func (k *keeperProc) dial() {
	if k.cfg.Connect == "" {
		_ = sendMsg(k.ctrl, opDialErr, []byte("no --connect socket configured"), -1, 0)
		return
	}
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err == nil {
		err = unix.Connect(s, &unix.SockaddrUnix{Name: k.cfg.Connect})
		if err != nil {
			unix.Close(s)
		}
	}
	if err != nil {
		_ = sendMsg(k.ctrl, opDialErr, []byte(err.Error()), -1, 0)
		return
	}
	_ = sendMsg(k.ctrl, opDialed, nil, s, 0)
	unix.Close(s)
}

// cleanup removes the daemon's files that are still its own and says
// which it could not.
func (k *keeperProc) cleanup() string {
	var failed []string
	for _, f := range k.cfg.Remove {
		if err := removeIfSame(f); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", f.Path, err))
		}
	}
	k.cfg.Remove = nil
	return strings.Join(failed, "; ")
}
