package isolation

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// allNames is every system call name the filters mention.
func allNames() []string {
	names := append(append(append(append(append([]string(nil), runtimeSyscalls...), daemonSyscalls...),
		keeperSyscalls...), metricsSyscalls...), enosysSyscalls...)
	names = append(names, controlSyscalls...)
	names = append(names, keeperDialSyscalls...)
	for _, spec := range []filterSpec{{role: roleDaemon, pid: 1}, {role: roleKeeper, pid: 1, dial: true}} {
		for _, c := range conditionalSyscalls(spec) {
			names = append(names, c.Name)
		}
	}
	return names
}

// TestNamesExistOnBothArchitectures: a name unknown to an architecture
// would fail the policy there at start-up; arm64 must at least build and
// assemble.
func TestNamesExistOnBothArchitectures(t *testing.T) {
	for goarch, a := range map[string]*arch.Info{"amd64": arch.X86_64, "arm64": arch.AARCH64} {
		for _, n := range append(allNames(), archSyscalls[goarch]...) {
			if _, ok := a.SyscallNames[n]; !ok {
				t.Errorf("%s: no system call %q", a.Name, n)
			}
		}
	}
}

// TestForbiddenCallsStayOut: what the sandbox exists to refuse is in no
// list, and opening files is allowed only with --metrics.
func TestForbiddenCallsStayOut(t *testing.T) {
	forbidden := []string{"execve", "execveat", "ptrace", "mount", "umount2", "pivot_root", "chroot",
		"open", "creat", "open_by_handle_at", "openat2", "unshare", "setns", "setuid", "setresuid", "capset",
		"process_vm_readv", "process_vm_writev", "kexec_load", "init_module", "finit_module", "bpf",
		"keyctl", "add_key", "userfaultfd", "perf_event_open", "fork", "vfork", "clone3", "io_uring_setup",
		"chmod", "fchmod", "chown", "fchown", "symlink", "link", "rename", "renameat2", "mkdir", "mknod",
		// Signals to others, other processes' descriptors, new executable
		// or file-backed memory, kernel interfaces with a history.
		"tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_send_signal", "pidfd_getfd", "pidfd_open",
		"memfd_create", "memfd_secret", "pkey_mprotect", "remap_file_pages", "personality",
		"io_uring_enter", "io_uring_register", "name_to_handle_at", "fanotify_init", "inotify_init1",
		"fsopen", "fsmount", "open_tree", "move_mount", "mount_setattr", "quotactl", "swapon", "reboot",
		"setpgid", "setsid", "setresgid", "setgroups", "ioprio_set", "sched_setattr", "lookup_dcookie",
		"kcmp", "mbind", "migrate_pages", "move_pages", "vmsplice", "splice", "tee", "sysfs", "acct"}
	for _, spec := range []filterSpec{{role: roleDaemon}, {role: roleDaemon, metrics: true}, {role: roleKeeper}, {role: roleKeeper, dial: true}} {
		allowed := allowedSyscalls(policy(spec))
		for _, n := range forbidden {
			if slices.Contains(allowed, n) {
				t.Errorf("%+v allows %s", spec, n)
			}
		}
		if spec.role == roleDaemon && slices.Contains(allowed, "unlinkat") {
			t.Errorf("%+v: the daemon may unlink (only its keeper removes files)", spec)
		}
		if got := slices.Contains(allowed, "openat"); got != spec.metrics {
			t.Errorf("%+v: openat allowed = %v", spec, got)
		}
		if spec.role == roleKeeper && slices.Contains(allowed, "socket") != spec.dial {
			t.Errorf("%+v: the keeper may make sockets: %v", spec, slices.Contains(allowed, "socket"))
		}
	}
}

// TestProgramAssembles: every policy assembles for this architecture, and
// with notify its default return, and nothing else, becomes USER_NOTIF.
func TestProgramAssembles(t *testing.T) {
	for _, spec := range []filterSpec{{role: roleDaemon, pid: os.Getpid()}, {role: roleDaemon, metrics: true, pid: 7}, {role: roleKeeper, pid: 9}, {role: roleKeeper, pid: 9, dial: true}} {
		plain, err := program(policy(spec), false)
		if err != nil {
			t.Fatalf("%+v: %v", spec, err)
		}
		notify, err := program(policy(spec), true)
		if err != nil {
			t.Fatalf("%+v: %v", spec, err)
		}
		if len(plain) != len(notify) {
			t.Fatalf("%+v: %d and %d instructions", spec, len(plain), len(notify))
		}
		for i := range plain {
			if i == len(plain)-1 {
				if plain[i] != missEPERM || notify[i] != (bpf.RetConstant{Val: unix.SECCOMP_RET_USER_NOTIF}) {
					t.Errorf("%+v: last instructions %v / %v", spec, plain[i], notify[i])
				}
			} else if plain[i] != notify[i] {
				t.Errorf("%+v: instruction %d differs: %v / %v", spec, i, plain[i], notify[i])
			}
		}
		if _, err := bpf.Assemble(notify); err != nil {
			t.Errorf("%+v: %v", spec, err)
		}
	}
}

// TestRefusalRoundTrip: the keeper's report decodes to what it encoded.
func TestRefusalRoundTrip(t *testing.T) {
	nr, a, err := parseRefusal(refusal(59, 0xc000003e))
	if err != nil || nr != 59 || a != 0xc000003e {
		t.Fatalf("%d %#x %v", nr, a, err)
	}
	if _, _, err := parseRefusal([]byte{1, 2, 3}); err == nil {
		t.Fatal("a short report decoded")
	}
}

// TestREADMECounts: the README's Security section quotes the lists' sizes;
// they must stay true.
func TestREADMECounts(t *testing.T) {
	b, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Join(strings.Fields(string(b)), " ")
	daemon := len(allowedSyscalls(policy(filterSpec{role: roleDaemon})))
	metrics := len(allowedSyscalls(policy(filterSpec{role: roleDaemon, metrics: true})))
	keeper := len(allowedSyscalls(policy(filterSpec{role: roleKeeper})))
	for _, want := range []string{
		fmt.Sprintf("permits %d system calls (%d with `--metrics`", daemon, metrics),
		fmt.Sprintf("seccomp_allowed_syscalls=%d", daemon),
		fmt.Sprintf("seccomp list of %d calls", keeper),
	} {
		if !strings.Contains(readme, want) {
			t.Errorf("README.md does not say %q", want)
		}
	}
}

// TestListenOnlyWithControl: listen(2) is allowed only to a daemon with a
// control endpoint, which opens forwarded TCP ports at run time; the
// others listen on nothing after start-up.
func TestListenOnlyWithControl(t *testing.T) {
	for _, spec := range []filterSpec{{role: roleDaemon}, {role: roleDaemon, metrics: true}, {role: roleDaemon, control: true}, {role: roleKeeper}} {
		if got := slices.Contains(allowedSyscalls(policy(spec)), "listen"); got != spec.control {
			t.Errorf("%+v: listen allowed = %v", spec, got)
		}
	}
}
