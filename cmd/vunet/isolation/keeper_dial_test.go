package isolation

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// dialChildEnv makes the test binary act as the child of
// TestKeeperDialsOnlyWithConnect: "dial" or "nodial" says which keeper
// filter it installs, dialPathEnv the UNIX socket it then connects to.
const (
	dialChildEnv = "VUNET_TEST_DIAL_CHILD"
	dialPathEnv  = "VUNET_TEST_DIAL_PATH"
)

// dialChild installs a keeper's filter and connects to a UNIX socket, as
// a keeper whose code had been taken over would try (a root keeper is
// trusted by many a root-only socket's server). It prints the error.
func dialChild(mode string) {
	if err := setNoNewPrivs(); err != nil {
		panic(err)
	}
	if _, err := installFilter(policy(filterSpec{role: roleKeeper, pid: os.Getpid(), dial: mode == "dial"}), false); err != nil {
		panic(err)
	}
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		err = unix.Connect(s, &unix.SockaddrUnix{Name: os.Getenv(dialPathEnv)})
	}
	if err != nil {
		os.Stdout.WriteString("socket/connect: " + err.Error())
	} else {
		os.Stdout.WriteString("connected")
	}
	os.Exit(0)
}

// TestKeeperDialsOnlyWithConnect: a keeper that has no --connect socket
// to dial can make no connection at all; one that has can.
func TestKeeperDialsOnlyWithConnect(t *testing.T) {
	if !seccompSupported() {
		t.Skip("no allow-list for this architecture")
	}
	for _, mode := range []string{"nodial", "dial"} {
		t.Run(mode, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s")
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), dialChildEnv+"="+mode, dialPathEnv+"="+path)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("child: %v (%s)", err, out)
			}
			// A connection the child made is in the backlog by now.
			l.SetDeadline(time.Now().Add(100 * time.Millisecond))
			c, acceptErr := l.Accept()
			if c != nil {
				c.Close()
			}
			switch mode {
			case "nodial":
				if acceptErr == nil || !strings.Contains(string(out), unix.EPERM.Error()) {
					t.Errorf("a keeper without --connect connected (child: %q, accept: %v)", out, acceptErr)
				}
			case "dial":
				if acceptErr != nil || string(out) != "connected" {
					t.Errorf("the --connect keeper could not dial (child: %q, accept: %v)", out, acceptErr)
				}
			}
		})
	}
}
