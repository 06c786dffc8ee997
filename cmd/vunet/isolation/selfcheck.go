package isolation

import (
	"errors"
	"log/slog"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// SelfCheckEnv, when set in the daemon's environment, makes Apply prove
// the sandbox right after applying it: it tries what a compromised daemon
// would try first and logs one line saying how each attempt failed. It is
// for tests and is not a flag: nothing a user runs needs it.
const SelfCheckEnv = "VUNET_SANDBOX_SELFCHECK"

// selfCheckPtracePID is a process ID above the kernel's maximum
// (PID_MAX_LIMIT, 2^22): a ptrace the filter let through would fail with
// ESRCH, one it refused fails with EPERM, and no real process is touched.
const selfCheckPtracePID = 1 << 30

// selfCheck tries execve, opening /etc/passwd and ptrace (twice, so a
// test can see the refusal logged once), and logs the errors.
func selfCheck(log *slog.Logger) {
	execErr := syscall.Exec("/bin/true", []string{"true"}, nil)
	f, openErr := os.Open("/etc/passwd")
	if openErr == nil {
		f.Close()
	}
	var ptraceErr error
	for range 2 {
		if _, _, e := syscall.Syscall6(unix.SYS_PTRACE, unix.PTRACE_ATTACH, selfCheckPtracePID, 0, 0, 0, 0); e != 0 {
			ptraceErr = e
		} else {
			ptraceErr = nil
		}
	}
	log.Info("sandbox self-check",
		"execve", errText(execErr), "open_etc_passwd", errText(openErr), "ptrace", errText(ptraceErr),
		"all_refused", refused(execErr) && refused(openErr) && refused(ptraceErr))
}

// refused reports an error a sandbox gives: EPERM (seccomp) or EACCES
// (Landlock).
func refused(err error) bool {
	return errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES)
}

func errText(err error) string {
	var errno syscall.Errno
	switch {
	case err == nil:
		return "succeeded"
	case errors.As(err, &errno):
		return unix.ErrnoName(errno) + ": " + errno.Error()
	}
	return err.Error()
}
