package main

import (
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// rawListener makes a listening UNIX stream socket as systemd passes it: a
// bare descriptor, without close-on-exec.
func rawListener(t *testing.T, path string) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 8); err != nil {
		t.Fatal(err)
	}
	return fd
}

func fdOpen(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil
}

func TestActivationFDs(t *testing.T) {
	env := func(vars map[string]string) func(string) string {
		return func(k string) string { return vars[k] }
	}
	for _, tc := range []struct {
		name    string
		vars    map[string]string
		want    []int
		wantErr bool
	}{
		{"unset", nil, nil, false},
		{"ours", map[string]string{"LISTEN_PID": "42", "LISTEN_FDS": "2"}, []int{3, 4}, false},
		// A child that inherited its parent's variables must not take
		// the parent's descriptors.
		{"another process's", map[string]string{"LISTEN_PID": "41", "LISTEN_FDS": "1"}, nil, false},
		{"no pid", map[string]string{"LISTEN_FDS": "1"}, nil, false},
		{"garbage count", map[string]string{"LISTEN_PID": "42", "LISTEN_FDS": "x"}, nil, true},
		{"negative count", map[string]string{"LISTEN_PID": "42", "LISTEN_FDS": "-1"}, nil, true},
	} {
		got, err := activationFDs(env(tc.vars), 42)
		if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, %v; want %v (error %v)", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestListenerFromFDs(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "vunet.sock")

	t.Run("served", func(t *testing.T) {
		fd := rawListener(t, sock)
		l, err := listenerFromFDs([]int{fd}, sock)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if fdOpen(fd) {
			t.Errorf("descriptor %d still open: the listener should hold its own close-on-exec copy", fd)
		}
		// The effect: a client connecting to the path reaches this listener.
		go func() {
			if c, err := net.Dial("unix", sock); err == nil {
				c.Write([]byte("x"))
				c.Close()
			}
		}()
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1)
		if _, err := c.Read(buf); err != nil || buf[0] != 'x' {
			t.Errorf("read %q, %v", buf, err)
		}
		c.Close()
		l.Close()
		// systemd's file: closing the listener must leave it.
		if _, err := net.Dial("unix", sock); err == nil || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("after close: dial %v, want connection refused on a file that is still there", err)
		}
	})

	t.Run("other path", func(t *testing.T) {
		fd := rawListener(t, filepath.Join(dir, "a.sock"))
		if _, err := listenerFromFDs([]int{fd}, filepath.Join(dir, "b.sock")); err == nil || !strings.Contains(err.Error(), "--socket says") {
			t.Errorf("mismatched --socket: %v", err)
		}
		if fdOpen(fd) {
			t.Errorf("descriptor %d left open", fd)
		}
	})

	t.Run("datagram", func(t *testing.T) {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := listenerFromFDs([]int{fd}, ""); err == nil || !strings.Contains(err.Error(), "not a listening UNIX stream socket") {
			t.Errorf("datagram socket: %v", err)
		}
	})

	t.Run("two", func(t *testing.T) {
		a, b := rawListener(t, filepath.Join(dir, "c.sock")), rawListener(t, filepath.Join(dir, "d.sock"))
		if _, err := listenerFromFDs([]int{a, b}, ""); err == nil || !strings.Contains(err.Error(), "more than one") {
			t.Errorf("two sockets: %v", err)
		}
		if fdOpen(a) || fdOpen(b) {
			t.Errorf("descriptors left open")
		}
	})
}
