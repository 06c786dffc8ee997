package isolation

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"syscall"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// role says whose filter is built: the daemon's or the keeper's.
type role int

const (
	roleDaemon role = iota
	roleKeeper
)

// The seccomp user-notification ioctls (linux/seccomp.h).
const (
	ioctlNotifRecv = unix.SECCOMP_IOCTL_NOTIF_RECV
	ioctlNotifSend = unix.SECCOMP_IOCTL_NOTIF_SEND
)

// filterSpec selects the allow-list.
type filterSpec struct {
	role    role
	pid     int  // our process ID (signals to ourselves only)
	metrics bool // --metrics: /proc/self is read
	control bool // --control: forwarded TCP ports open at run time
	dial    bool // the keeper dials the --connect socket
}

// policy is the allow-list as a go-seccomp-bpf policy: clone3 fails with
// ENOSYS, the lists are allowed, anything else is a miss, EPERM (program
// turns that into the keeper's notification where one listens).
func policy(s filterSpec) seccomp.Policy {
	names := append(append([]string(nil), runtimeSyscalls...), archSyscalls[runtime.GOARCH]...)
	switch s.role {
	case roleDaemon:
		names = append(names, daemonSyscalls...)
		if s.metrics {
			names = append(names, metricsSyscalls...)
		}
		if s.control {
			names = append(names, controlSyscalls...)
		}
	case roleKeeper:
		names = append(names, keeperSyscalls...)
		if s.dial {
			names = append(names, keeperDialSyscalls...)
		}
	}
	return seccomp.Policy{
		DefaultAction: seccomp.ActionErrno,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: enosysSyscalls},
			{Action: seccomp.ActionAllow, Names: dedupe(names), NamesWithCondtions: conditionalSyscalls(s)},
		},
	}
}

// allowedSyscalls lists, sorted, the system calls the policy allows at
// all (some only with given arguments).
func allowedSyscalls(p seccomp.Policy) []string {
	seen := map[string]bool{}
	var out []string
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	for _, g := range p.Syscalls {
		if g.Action != seccomp.ActionAllow {
			continue
		}
		for _, n := range g.Names {
			add(n)
		}
		for _, n := range g.NamesWithCondtions {
			add(n.Name)
		}
	}
	slices.Sort(out)
	return out
}

func dedupe(names []string) []string {
	seen := map[string]bool{}
	out := names[:0]
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// errNoListener reports a kernel that cannot hand misses to a listener
// (before 5.7, TSYNC and NEW_LISTENER exclude each other).
var errNoListener = errors.New("seccomp user notification unavailable")

// missEPERM is the policy's default action as go-seccomp-bpf assembles it.
var missEPERM = bpf.RetConstant{Val: uint32(seccomp.ActionErrno) | uint32(unix.EPERM)}

// program assembles the policy. With notify, a miss goes to the keeper
// (SECCOMP_RET_USER_NOTIF) instead of failing with EPERM at once:
// go-seccomp-bpf validates its default action against a list that lacks
// USER_NOTIF, so the program's last instruction, the default return that
// every unmatched call (and a foreign architecture) reaches, is replaced.
func program(p seccomp.Policy, notify bool) ([]bpf.Instruction, error) {
	insts, err := p.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp policy: %w", err)
	}
	if notify {
		last := len(insts) - 1
		if last < 0 || insts[last] != missEPERM {
			return nil, fmt.Errorf("seccomp program does not end in the default action (%v)", insts[last])
		}
		insts[last] = bpf.RetConstant{Val: unix.SECCOMP_RET_USER_NOTIF}
	}
	return insts, nil
}

// installFilter loads the policy on every thread of the process (TSYNC)
// and, when asked, returns the notification descriptor for the keeper.
// go-seccomp-bpf assembles the program (see program); the seccomp(2) call
// is ours because the library's LoadFilter has no way to return the
// listener descriptor that SECCOMP_FILTER_FLAG_NEW_LISTENER creates.
func installFilter(p seccomp.Policy, listener bool) (fd int, err error) {
	insts, err := program(p, listener)
	if err != nil {
		return -1, err
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return -1, fmt.Errorf("seccomp program: %w", err)
	}
	prog := make([]unix.SockFilter, len(raw))
	for i, in := range raw {
		prog[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	flags := uintptr(unix.SECCOMP_FILTER_FLAG_TSYNC)
	if listener {
		// TSYNC_ESRCH: with NEW_LISTENER the return value is the
		// descriptor, so a thread that cannot be synchronised must be
		// reported as an error, not as its thread ID.
		flags |= unix.SECCOMP_FILTER_FLAG_NEW_LISTENER | unix.SECCOMP_FILTER_FLAG_TSYNC_ESRCH
	}
	r, _, e := syscall.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	if e != 0 {
		if listener && e == unix.EINVAL {
			return -1, errNoListener
		}
		return -1, fmt.Errorf("seccomp: %w", e)
	}
	if !listener && r != 0 {
		return -1, fmt.Errorf("seccomp: thread %d could not be synchronised", r)
	}
	if !listener {
		return -1, nil
	}
	return int(r), nil
}
