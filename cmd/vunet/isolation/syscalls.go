package isolation

import (
	"runtime"

	"golang.org/x/sys/unix"

	seccomp "github.com/elastic/go-seccomp-bpf"
)

// The allow-lists. They were derived in two ways that check each other
// (README "Security", the commit that added them): from what the Go
// runtime can call after start-up (runtime/sys_linux_*.s and
// internal/runtime/syscall) plus the calls vunet's packages make on the
// data and control planes, and from `strace -f -c` of the daemon through
// whole QEMU end-to-end runs (guest DHCP, 100 MB each way, metrics
// scrapes, pcap, client-mode reconnects, SIGTERM). A call missing here
// fails with EPERM and is logged once by the keeper (keeper.go), so a gap
// shows up as a log line the test suites fail on, not as a crash.

// runtimeSyscalls are what the Go runtime (scheduler, memory, signals,
// netpoller, timers) and glibc's thread start-up in cgo builds call at any
// time. Calls with arguments worth restricting are in conditionalSyscalls.
var runtimeSyscalls = []string{
	"read", "write", "close",
	"munmap", "madvise",
	"futex", "sched_yield", "sched_getaffinity", "nanosleep",
	// sysmon re-reads the cgroup CPU limit (GOMAXPROCS) every second
	// through a descriptor it keeps open.
	"pread64",
	// vDSO calls whose fallback is the system call.
	"clock_gettime", "getrandom",
	// Signals: preemption and handlers (signal.Stop at exit).
	"rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack", "restart_syscall",
	"getpid", "gettid",
	// The netpoller.
	"epoll_create1", "epoll_ctl", "epoll_pwait", "eventfd2",
	// exit ends a thread whose goroutine exited locked to it (none of
	// vunet's are, but the runtime may).
	"exit", "exit_group",
	// glibc's pthread_create in cgo builds (Go's own threads need neither).
	"set_robust_list", "rseq",
}

// daemonSyscalls are vunet's own after start-up: the vhost-user control
// plane (messages with descriptors, guest memory, eventfds), the per-queue
// event loops and host sockets, the metrics endpoint, the capped log
// file, and reaping the keeper.
var daemonSyscalls = []string{
	"pwrite64", "ftruncate", "fstat", // the capped log file (and pread64)
	"sendmsg", "recvmsg", "recvfrom", // vhost-user messages and descriptors; flows
	"recvmmsg", "sendmmsg", // UDP flows' datagrams in batches
	"accept4", "bind", "connect", "getsockname", "getpeername", "getsockopt", "setsockopt", "shutdown",
	"timerfd_create", "timerfd_settime",
	// Guest kick/call/err eventfds that cannot block us (virtqueue):
	// reads with preadv2 RWF_NOWAIT, signals through one Linux AIO
	// context made on first use, poll-then-write without it.
	"preadv2", "ppoll", "io_setup", "io_submit", "io_getevents", "io_destroy",
	// A descriptor from the front-end is checked to be an eventfd by its
	// /proc/self/fd link (vhostuser). Landlock has no right for readlink;
	// the daemon only reads its own descriptors' links.
	"readlinkat",
	// A guest memory or dirty-log file is checked not to live on a FUSE
	// or network file system before it is mapped (virtqueue.CheckSharedFile).
	"fstatfs",
	// A background daemon points its standard streams at /dev/null
	// (opened before the sandbox) when it becomes ready (x/sys's Dup2 is
	// dup3 on amd64 and arm64 alike).
	"dup3",
	// Reaping the keeper: waitid on its pidfd, wait4 where pidfds are
	// missing.
	"waitid", "wait4",
}

// archSyscalls are the names that differ between the architectures the
// sandbox supports (amd64 is tested; arm64 builds and assembles). Both
// roles stat files: the daemon's os.File.Stat, the keeper's lstat before
// removing.
var archSyscalls = map[string][]string{
	"amd64": {"newfstatat"},
	"arm64": {"fstatat"},
}

// keeperSyscalls are the keeper's: its control socket, the seccomp
// notification descriptor and removing the daemon's files.
var keeperSyscalls = []string{
	"sendmsg", "recvmsg", "unlinkat",
}

// keeperDialSyscalls are the keeper's only with --connect, to dial the
// front-end's socket for the daemon (with socket for AF_UNIX only). A
// keeper without it can make no new connection: started by root it keeps
// uid 0, which a UNIX socket's server may trust (a system bus, a
// container engine) and Landlock governs connect() only from ABI 9.
var keeperDialSyscalls = []string{"connect"}

// metricsSyscalls serve --metrics: the Prometheus process collector
// opens files under /proc/self (Landlock keeps every other path shut)
// after checking that /proc is procfs.
var metricsSyscalls = []string{"openat", "getdents64", "statfs"}

// controlSyscalls serve --control: a TCP port forwarded at run time is a
// new listening socket (bind, socket and setsockopt are the data path's
// already).
var controlSyscalls = []string{"listen"}

// enosysSyscalls fail with ENOSYS rather than EPERM and are not logged:
// glibc's pthread_create tries clone3 first and falls back to clone (whose
// flags the filter can check) only on ENOSYS. Go never calls clone3.
var enosysSyscalls = []string{"clone3"}

// conditionalSyscalls are allowed only with the arguments vunet's use
// needs; anything else is a miss. spec.pid is the filtered process's ID,
// which the sandbox never changes.
func conditionalSyscalls(spec filterSpec) []seccomp.NameWithConditions {
	pid := spec.pid
	self := func(name string) seccomp.NameWithConditions {
		return seccomp.NameWithConditions{Name: name, Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.Equal, Value: uint64(pid)},
		}}
	}
	noExec := func(name string) seccomp.NameWithConditions {
		return seccomp.NameWithConditions{Name: name, Conditions: seccomp.ArgumentConditions{
			{Argument: 2, Operation: seccomp.BitsNotSet, Value: unix.PROT_EXEC},
		}}
	}
	c := []seccomp.NameWithConditions{
		// Threads only: a clone without CLONE_THREAD would be a new
		// process.
		{Name: "clone", Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.BitsSet, Value: unix.CLONE_THREAD},
		}},
		// Signals to ourselves only: preemption (tgkill), a crash's
		// re-raised signal (kill).
		self("tgkill"), self("kill"),
		// No executable memory: nothing is loaded after start-up.
		noExec("mmap"), noExec("mprotect"),
		// The runtime names its anonymous mappings (Go 1.25+).
		{Name: "prctl", Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.Equal, Value: unix.PR_SET_VMA},
		}},
	}
	c = append(c, fcntlConditions()...)
	families := []uint64{unix.AF_INET, unix.AF_INET6}
	ioctls := []uint64{unix.SIOCINQ, unix.SIOCOUTQ}
	if spec.role == roleKeeper {
		families = nil
		if spec.dial {
			families = []uint64{unix.AF_UNIX}
		}
		ioctls = []uint64{ioctlNotifRecv, ioctlNotifSend}
	}
	for _, f := range families {
		c = append(c, seccomp.NameWithConditions{Name: "socket", Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.Equal, Value: f},
		}})
	}
	for _, req := range ioctls {
		c = append(c, seccomp.NameWithConditions{Name: "ioctl", Conditions: seccomp.ArgumentConditions{
			{Argument: 1, Operation: seccomp.Equal, Value: req},
		}})
	}
	return c
}

// fcntlCommands are the fcntl commands Go's runtime and standard library
// and vunet use after start-up: non-blocking mode and the log file's
// append flag (GETFL/SETFL), close-on-exec (GETFD/SETFD), and the
// duplicate net.FileConn makes (DUPFD_CLOEXEC). The rest stay out, above
// all F_SETOWN/F_SETOWN_EX and F_SETSIG: with O_ASYNC they make the kernel
// signal a process of the caller's choosing, checked only against the
// credentials of whoever set the owner, and a uid-0 owner (the keeper)
// may signal any process at all, capability or not (fs/fcntl.c
// sigio_perm). "Signals only to ourselves" must hold for them too.
var fcntlCommands = []uint64{unix.F_GETFL, unix.F_GETFD, unix.F_SETFD, unix.F_DUPFD_CLOEXEC}

// fcntlConditions allows fcntlCommands, and F_SETFL without O_ASYNC (a
// descriptor from the front-end may come with an owner set).
func fcntlConditions() []seccomp.NameWithConditions {
	var c []seccomp.NameWithConditions
	for _, cmd := range fcntlCommands {
		c = append(c, seccomp.NameWithConditions{Name: "fcntl", Conditions: seccomp.ArgumentConditions{
			{Argument: 1, Operation: seccomp.Equal, Value: cmd},
		}})
	}
	return append(c, seccomp.NameWithConditions{Name: "fcntl", Conditions: seccomp.ArgumentConditions{
		{Argument: 1, Operation: seccomp.Equal, Value: unix.F_SETFL},
		{Argument: 2, Operation: seccomp.BitsNotSet, Value: unix.O_ASYNC},
	}})
}

// seccompSupported reports whether this architecture has an allow-list.
func seccompSupported() bool { return archSyscalls[runtime.GOARCH] != nil }
