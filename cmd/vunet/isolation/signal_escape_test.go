package isolation

import (
	"encoding/json"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sigioChildEnv makes the test binary act as the child of
// TestFilterKeepsSignalsHome: its value is the role whose filter the
// child installs, sigioTargetEnv the process it tries to signal.
const (
	sigioChildEnv  = "VUNET_TEST_SIGIO_CHILD"
	sigioTargetEnv = "VUNET_TEST_SIGIO_TARGET"
)

// sigioChild installs a role's filter, then tries to have the kernel
// signal another process for it: F_SETOWN names the target, F_SETSIG the
// signal, O_ASYNC arms the socket and a write to its peer fires it. The
// kernel checks such a signal against the credentials of whoever called
// F_SETOWN, and lets a uid-0 owner signal any process at all, capability
// or not (fs/fcntl.c sigio_perm): the keeper is uid 0. It reports each
// step's errno.
func sigioChild(roleName string) {
	r := roleDaemon
	if roleName == "keeper" {
		r = roleKeeper
	}
	target, _ := strconv.Atoi(os.Getenv(sigioTargetEnv))
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		panic(err)
	}
	if err := setNoNewPrivs(); err != nil {
		panic(err)
	}
	if _, err := installFilter(policy(filterSpec{role: r, pid: os.Getpid()}), false); err != nil {
		panic(err)
	}
	res := map[string]string{}
	step := func(name string, err error) {
		res[name] = "ok"
		if err != nil {
			res[name] = err.Error()
		}
	}
	_, err = unix.FcntlInt(uintptr(fds[0]), unix.F_SETOWN, target)
	step("setown", err)
	_, err = unix.FcntlInt(uintptr(fds[0]), unix.F_SETSIG, int(unix.SIGUSR1))
	step("setsig", err)
	fl, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFL, 0)
	step("getfl", err)
	_, err = unix.FcntlInt(uintptr(fds[0]), unix.F_SETFL, fl|unix.O_ASYNC)
	step("setfl_async", err)
	_, err = unix.FcntlInt(uintptr(fds[0]), unix.F_SETFL, fl|unix.O_NONBLOCK)
	step("setfl", err)
	_, err = unix.Write(fds[1], []byte("x"))
	step("write", err)
	// What Go does with fcntl after the sandbox: close-on-exec, a
	// duplicate for net.FileConn.
	fd, err := unix.FcntlInt(uintptr(fds[0]), unix.F_DUPFD_CLOEXEC, 0)
	step("dupfd_cloexec", err)
	_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
	step("setfd", err)
	_, err = unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	step("getfd", err)
	json.NewEncoder(os.Stdout).Encode(res)
	os.Exit(0)
}

// TestFilterKeepsSignalsHome: "signals only to itself" holds for the
// filtered daemon and keeper through fcntl as well as kill: a filtered
// process cannot aim SIGIO (or any signal, F_SETSIG) at another process.
// The commands Go and vunet need (GETFL/SETFL, GETFD/SETFD,
// DUPFD_CLOEXEC) still work.
func TestFilterKeepsSignalsHome(t *testing.T) {
	if !seccompSupported() {
		t.Skip("no allow-list for this architecture")
	}
	for _, role := range []string{"daemon", "keeper"} {
		t.Run(role, func(t *testing.T) {
			got := make(chan os.Signal, 4)
			signal.Notify(got, syscall.SIGUSR1)
			defer signal.Stop(got)
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), sigioChildEnv+"="+role, sigioTargetEnv+"="+strconv.Itoa(os.Getpid()))
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("child: %v (%s)", err, out)
			}
			var res map[string]string
			if err := json.Unmarshal(out, &res); err != nil {
				t.Fatalf("child said %q: %v", out, err)
			}
			// The signal, if the child could send it, was queued to us
			// in its write, before it exited.
			select {
			case s := <-got:
				t.Errorf("the filtered %s signalled another process (%v): %v", role, s, res)
			case <-time.After(200 * time.Millisecond):
			}
			eperm := unix.EPERM.Error()
			if res["setown"] != eperm || res["setsig"] != eperm || res["setfl_async"] != eperm {
				t.Errorf("F_SETOWN %q, F_SETSIG %q, F_SETFL O_ASYNC %q: want %q (refused by the filter)",
					res["setown"], res["setsig"], res["setfl_async"], eperm)
			}
			if res["getfl"] != "ok" || res["setfl"] != "ok" || res["write"] != "ok" ||
				res["dupfd_cloexec"] != "ok" || res["setfd"] != "ok" || res["getfd"] != "ok" {
				t.Errorf("the commands Go needs failed: %v", res)
			}
		})
	}
}
