package main

import (
	"bytes"
	"encoding/binary"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/vhostuser"
)

// Tests of passt's start-up semantics against the built binary: the
// launched command returns once the daemon serves, and the daemon is
// another process, in its own session, whose pid is in the pid file.

// passtBinary is the built vunet behind a symlink named passt, as a
// management stack finds it in its PATH.
func passtBinary(t *testing.T) string {
	t.Helper()
	link := filepath.Join(t.TempDir(), "passt")
	if err := os.Symlink(vunetBinary(t), link); err != nil {
		t.Fatal(err)
	}
	return link
}

// launched is a finished launcher run.
type launched struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// launch runs argv to its end, with its output read to end of file as
// libvirt and QEMU do: a daemon that kept the launcher's streams open
// would hold this up until the timeout.
func launch(t *testing.T, env []string, extra []*os.File, argv ...string) launched {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.ExtraFiles = extra
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("%v still running (or its output still open) after 20s\nstderr: %s", argv, errb.String())
	}
	return launched{cmd.ProcessState.ExitCode(), out.String(), errb.String(), time.Since(start)}
}

// daemonFromPIDFile reads the pid file, checks the process is a vunet
// daemon other than the launcher and leading its own session, and
// arranges for it to be stopped at the end of the test.
func daemonFromPIDFile(t *testing.T, path string, launcher int) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		t.Fatalf("pid file holds %q", b)
	}
	t.Cleanup(func() { stopDaemon(t, pid) })
	if pid == launcher {
		t.Errorf("pid file names the launcher %d, not the daemon", pid)
	}
	sid, err := unix.Getsid(pid)
	if err != nil {
		t.Fatalf("daemon %d: %v", pid, err)
	}
	if sid != pid {
		t.Errorf("daemon %d is in session %d, want its own", pid, sid)
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if want, _ := filepath.EvalSymlinks(vunetBinary(t)); err != nil || exe != want {
		t.Errorf("pid %d runs %q (%v), want %s", pid, exe, err, want)
	}
	return pid
}

// stopDaemon sends SIGTERM to a daemon this test started and waits up to
// 3 s for it to go (it is not our child: poll).
func stopDaemon(t *testing.T, pid int) {
	if syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	for i := 0; i < 300; i++ {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	t.Errorf("daemon %d still running 3s after SIGTERM", pid)
}

// getFeatures performs VHOST_USER_GET_FEATURES on c and returns the
// features: the daemon really serves the front-end.
func getFeatures(t *testing.T, c net.Conn) uint64 {
	t.Helper()
	var req [12]byte
	binary.LittleEndian.PutUint32(req[0:], uint32(vhostuser.ReqGetFeatures))
	binary.LittleEndian.PutUint32(req[4:], 1) // version 1
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(req[:]); err != nil {
		t.Fatalf("GET_FEATURES: %v", err)
	}
	var rep [20]byte
	if _, err := readFull(c, rep[:]); err != nil {
		t.Fatalf("GET_FEATURES reply: %v", err)
	}
	if r := binary.LittleEndian.Uint32(rep[0:]); r != uint32(vhostuser.ReqGetFeatures) {
		t.Fatalf("reply to request %d", r)
	}
	return binary.LittleEndian.Uint64(rep[12:])
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// TestPasstStartsInBackground: invoked as passt, without -f, the command
// returns 0 once the socket is bound, the daemon's pid in the pid file;
// the daemon serves (the stream protocol as passt without --vhost-user,
// else vhost-user), and leaves with its socket and pid file once its one
// front-end has gone.
func TestPasstStartsInBackground(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bin    func(*testing.T) string
		args   []string
		stream bool
	}{
		{"as passt", passtBinary, nil, true},
		{"as passt --vhost-user", passtBinary, []string{"--vhost-user"}, false},
		{"vunet --vhost-user", vunetBinary, []string{"--vhost-user"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sock, pidFile := filepath.Join(dir, "p.sock"), filepath.Join(dir, "p.pid")
			argv := append(append([]string{tc.bin(t)}, tc.args...), "--one-off", "--socket", sock, "--pid", pidFile)
			r := launch(t, nil, nil, argv...)
			if r.code != 0 {
				t.Fatalf("launcher exit %d, stderr:\n%s", r.code, r.stderr)
			}
			t.Logf("launcher returned after %v", r.took.Round(time.Millisecond))
			pid := daemonFromPIDFile(t, pidFile, -1)
			if st, err := os.Stat(sock); err != nil || st.Mode()&os.ModeSocket == 0 {
				t.Fatalf("socket %s: %v", sock, err)
			}
			c, err := net.Dial("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			if tc.stream {
				if !answersARP(t, c) {
					t.Error("no ARP reply on the stream")
				}
			} else if f := getFeatures(t, c); f&(1<<32) == 0 { // VIRTIO_F_VERSION_1
				t.Errorf("features %#x lack VERSION_1", f)
			}
			c.Close()
			// --one-off: the front-end left, so the daemon leaves, with
			// its socket and pid file.
			for i := 0; i < 300 && syscall.Kill(pid, 0) == nil; i++ {
				time.Sleep(10 * time.Millisecond)
			}
			if syscall.Kill(pid, 0) == nil {
				t.Fatalf("daemon %d still running 3s after its one front-end left", pid)
			}
			for _, f := range []string{sock, pidFile} {
				if _, err := os.Lstat(f); !os.IsNotExist(err) {
					t.Errorf("%s left behind (%v)", f, err)
				}
			}
		})
	}
}

// TestBackgroundStartupError: a start-up error is the launcher's exit
// status, with the error on its standard error (what libvirt shows), and
// nothing is left running or on disk.
func TestBackgroundStartupError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad interface", []string{"--interface", "nosuchif0"}, "--interface nosuchif0"},
		{"port in use", []string{"--tcp-ports", "127.0.0.1/" + port}, "address already in use"},
		{"flag error", []string{"--mtu", "12"}, "--mtu 12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sock, pidFile := filepath.Join(dir, "e.sock"), filepath.Join(dir, "e.pid")
			r := launch(t, nil, nil, append([]string{passtBinary(t), "--vhost-user", "--socket", sock, "--pid", pidFile}, tc.args...)...)
			if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want non-zero and %q", r.code, r.stderr, tc.want)
			}
			for _, f := range []string{sock, pidFile} {
				if _, err := os.Lstat(f); !os.IsNotExist(err) {
					t.Errorf("%s left behind (%v)", f, err)
				}
			}
		})
	}
}

// TestForegroundKept: -f, and NOTIFY_SOCKET (systemd Type=notify), keep
// the process in the foreground; under NOTIFY_SOCKET it reports READY=1
// with its own pid once the socket is bound.
func TestForegroundKept(t *testing.T) {
	dir := t.TempDir()
	notify := filepath.Join(dir, "notify")
	nl, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"-f", nil, []string{"-f"}},
		{"NOTIFY_SOCKET", []string{"NOTIFY_SOCKET=" + notify}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock, pidFile := filepath.Join(dir, tc.name+".sock"), filepath.Join(dir, tc.name+".pid")
			cmd := exec.Command(passtBinary(t), append(tc.args, "--socket", sock, "--pid", pidFile)...)
			cmd.Env = append(os.Environ(), tc.env...)
			var errb lockedBuffer
			cmd.Stderr = &errb
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			defer func() {
				cmd.Process.Signal(syscall.SIGTERM)
				<-done
			}()
			waitFile(t, sock)
			if tc.env != nil {
				nl.SetReadDeadline(time.Now().Add(5 * time.Second))
				b := make([]byte, 256)
				n, err := nl.Read(b)
				want := "READY=1\nMAINPID=" + strconv.Itoa(cmd.Process.Pid)
				if err != nil || string(b[:n]) != want {
					t.Errorf("notification %q (%v), want %q", b[:n], err, want)
				}
			}
			select {
			case <-done:
				t.Fatalf("exited (%v) instead of staying in the foreground:\n%s", cmd.ProcessState, errb.String())
			case <-time.After(500 * time.Millisecond):
			}
			b, _ := os.ReadFile(pidFile)
			if strings.TrimSpace(string(b)) != strconv.Itoa(cmd.Process.Pid) {
				t.Errorf("pid file %q, want %d", b, cmd.Process.Pid)
			}
		})
	}
}

// TestBackgroundFD: QEMU's form, --fd 3 with the other end of a socket
// pair kept by the caller: the daemon inherits the descriptor through the
// re-exec and serves it.
func TestBackgroundFD(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours := os.NewFile(uintptr(fds[0]), "frontend")
	theirs := os.NewFile(uintptr(fds[1]), "backend")
	defer ours.Close()
	pidFile := filepath.Join(t.TempDir(), "fd.pid")
	r := launch(t, nil, []*os.File{theirs}, vunetBinary(t), "--vhost-user", "--quiet", "--pid", pidFile, "--fd", "3")
	theirs.Close()
	if r.code != 0 {
		t.Fatalf("launcher exit %d:\n%s", r.code, r.stderr)
	}
	pid := daemonFromPIDFile(t, pidFile, -1)
	c, err := net.FileConn(ours) // a duplicate: close ours for the peer to see the end
	ours.Close()
	if err != nil {
		t.Fatal(err)
	}
	if f := getFeatures(t, c); f&(1<<32) == 0 {
		t.Errorf("features %#x lack VERSION_1", f)
	}
	c.Close()
	for i := 0; i < 300 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("daemon %d still running 3s after the --fd peer closed", pid)
	}
}
