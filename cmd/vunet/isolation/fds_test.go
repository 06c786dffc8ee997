package isolation

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// fdsChildEnv makes the test binary act as the child of
// TestCloseInheritedFDs.
const fdsChildEnv = "VUNET_TEST_FDS_CHILD"

// fdsChild reports what CloseInheritedFDs(4) closed and which of
// descriptors 3..6 are open afterwards.
func fdsChild() {
	closed := CloseInheritedFDs(4)
	var open []int
	for fd := 3; fd <= 6; fd++ {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
			open = append(open, fd)
		}
	}
	json.NewEncoder(os.Stdout).Encode(map[string][]int{"closed": closed, "open": open})
	os.Exit(0)
}

func TestMain(m *testing.M) {
	if os.Getenv(fdsChildEnv) != "" {
		fdsChild()
	}
	if r := os.Getenv(sigioChildEnv); r != "" {
		sigioChild(r)
	}
	if m := os.Getenv(dialChildEnv); m != "" {
		dialChild(m)
	}
	os.Exit(m.Run())
}

// TestCloseInheritedFDs: a child inherits descriptors 3, 4 and 5; it is
// given 4 (as --fd), so 3 and 5 are closed and 4 stays open.
func TestCloseInheritedFDs(t *testing.T) {
	var files []*os.File
	for i := 0; i < 3; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		defer w.Close()
		files = append(files, r)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fdsChildEnv+"=1")
	cmd.ExtraFiles = files // 3, 4, 5
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	var got map[string][]int
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("child said %q: %v", out, err)
	}
	// The test's own parent may have leaked more descriptors to us:
	// closed holds those too.
	if !slices.Contains(got["closed"], 3) || !slices.Contains(got["closed"], 5) || slices.Contains(got["closed"], 4) ||
		!slices.Contains(got["open"], 4) || slices.Contains(got["open"], 3) || slices.Contains(got["open"], 5) {
		t.Fatalf("closed %v, open %v; want 3 and 5 closed, 4 open", got["closed"], got["open"])
	}
}

// TestListenFDs: systemd's socket-activation descriptors count only when
// LISTEN_PID names this process.
func TestListenFDs(t *testing.T) {
	t.Setenv("LISTEN_FDS", "2")
	t.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	if got := listenFDs(); !slices.Equal(got, []int{3, 4}) {
		t.Fatalf("listenFDs %v, want [3 4]", got)
	}
	t.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()+1))
	if got := listenFDs(); got != nil {
		t.Fatalf("another process's LISTEN_FDS taken: %v", got)
	}
}
