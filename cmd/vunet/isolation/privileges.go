package isolation

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/psx"
)

// Credentials and capabilities are per thread in Linux, and a Go process
// has many threads it does not control. Every change here therefore runs
// on all of them: syscall.Setresuid/Setresgid/Setgroups do so since Go
// 1.16 (AllThreadsSyscall, or glibc's broadcast in cgo builds), and psx
// does the same for capset and prctl in both build modes.

// dropPrivileges switches every thread to id with no supplementary
// groups and no capability in any set (effective, permitted, inheritable,
// ambient, bounding). What an unprivileged process cannot do (clear a
// bounding set, drop inherited groups) is returned as notes; an explicit
// user switch that is not permitted is an error.
func dropPrivileges(id identity) (notes []string, err error) {
	if err := syscall.Setgroups(nil); err != nil {
		if groups, _ := os.Getgroups(); len(groups) > 0 && !(len(groups) == 1 && groups[0] == id.gid) {
			notes = append(notes, fmt.Sprintf("supplementary groups %v kept (setgroups: %v)", groups, err))
		}
	}
	if n, err := dropBoundingSet(); err != nil {
		notes = append(notes, fmt.Sprintf("capability bounding set kept, %d capabilities (no CAP_SETPCAP: %v)", n, err))
	}
	// Ambient capabilities would survive the user switch; clearing
	// needs no privilege. EINVAL: a kernel without them (before 4.3).
	if _, _, e := psx.Syscall6(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, 0); e != 0 && e != unix.EINVAL {
		return notes, fmt.Errorf("clear ambient capabilities: %w", e)
	}
	if id.gid != os.Getegid() || id.gid != os.Getgid() {
		if err := syscall.Setresgid(id.gid, id.gid, id.gid); err != nil {
			return notes, fmt.Errorf("switch to group %d: %w (switching user needs root or CAP_SETGID)", id.gid, err)
		}
	}
	if id.uid != os.Geteuid() || id.uid != os.Getuid() {
		if err := syscall.Setresuid(id.uid, id.uid, id.uid); err != nil {
			return notes, fmt.Errorf("switch to user %d: %w (switching user needs root or CAP_SETUID)", id.uid, err)
		}
	}
	// The switch away from root cleared effective and permitted, not
	// inheritable; a --runas root kept them all. Lowering is always
	// allowed.
	if err := clearCapabilities(); err != nil {
		return notes, err
	}
	return notes, nil
}

// dropBoundingSet removes every capability from every thread's bounding
// set, so that no later execve (which seccomp forbids anyway) could regain
// one. It returns how many remained when it was not permitted.
func dropBoundingSet() (remaining int, err error) {
	for c := 0; ; c++ {
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			return 0, nil // past the kernel's last capability
		}
		if err != nil {
			return 0, fmt.Errorf("read bounding set: %w", err)
		}
		if in == 0 {
			continue
		}
		if _, _, e := psx.Syscall6(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0, 0); e != 0 {
			return boundingCount(), e
		}
	}
}

// boundingCount counts the capabilities left in the bounding set.
func boundingCount() int {
	n := 0
	for c := 0; ; c++ {
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err != nil {
			return n
		}
		n += in
	}
}

// clearCapabilities empties the effective, permitted and inheritable sets
// of every thread.
func clearCapabilities() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if _, _, e := psx.Syscall3(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("clear capabilities: %w", e)
	}
	return nil
}

// capabilitiesEmpty reports whether the calling thread holds no
// effective, permitted or inheritable capability.
func capabilitiesEmpty() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	for _, d := range data {
		if d.Effective|d.Permitted|d.Inheritable != 0 {
			return false
		}
	}
	return true
}

// setNoNewPrivs sets no_new_privs on every thread: no execve could gain
// privileges, and seccomp filters may be installed without CAP_SYS_ADMIN.
func setNoNewPrivs() error {
	if _, _, e := psx.Syscall6(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0); e != 0 {
		return fmt.Errorf("no_new_privs: %w", e)
	}
	return nil
}

// setNotDumpable stops core dumps and ptrace attaches by the same user
// (the process's memory holds mappings of the guest's).
func setNotDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("dumpable: %w", err)
	}
	return nil
}
