package logfile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func marker(removed int64) []byte { return fmt.Appendf(nil, "CUT %d\n", removed) }

// TestCapKeepsNewestWholeLines writes numbered lines far past the cap:
// after every write the file is within the cap, starts with one marker
// line, and holds a run of whole, consecutive lines ending with the
// newest.
func TestCapKeepsNewestWholeLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	const max = 4096
	f, err := Open(path, max, marker)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cuts := 0
	for i := 0; i < 2000; i++ {
		line := fmt.Sprintf("line %d %s\n", i, strings.Repeat("x", i%97))
		if n, err := f.Write([]byte(line)); err != nil || n != len(line) {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > max {
			t.Fatalf("after line %d the file has %d bytes, cap %d", i, len(b), max)
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		first := 0
		if strings.HasPrefix(lines[0], "CUT ") {
			cuts++
			first = 1
		} else if i > 200 {
			t.Fatalf("after line %d no marker line: %q", i, lines[0])
		}
		want := i
		for j := len(lines) - 1; j >= first; j-- {
			f := strings.Fields(lines[j])
			if len(f) < 2 || f[0] != "line" || f[1] != strconv.Itoa(want) {
				t.Fatalf("after line %d: line %d of the file is %q, want line %d", i, j, lines[j], want)
			}
			want--
		}
	}
	if cuts == 0 {
		t.Fatal("no cut happened")
	}
}

// TestMarkerCountsRemovedBytes: the marker says exactly how many bytes of
// old lines went.
func TestMarkerCountsRemovedBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	f, err := Open(path, MinMax, marker)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line := []byte(strings.Repeat("a", 99) + "\n") // 100 bytes
	for i := 0; i < 41; i++ {                      // 4100 bytes: one cut
		f.Write(line)
	}
	b, _ := os.ReadFile(path)
	var removed int
	if _, err := fmt.Sscanf(string(b), "CUT %d\n", &removed); err != nil {
		t.Fatalf("no marker: %q", b[:20])
	}
	kept := bytes.Count(b, line)
	if removed != (41-kept)*100 || removed%100 != 0 {
		t.Fatalf("marker says %d bytes removed, file keeps %d of 41 lines", removed, kept)
	}
	if len(b) > MinMax*keepQuarters/4+len(line)+len("CUT 9999\n") {
		t.Fatalf("after the cut the file has %d bytes", len(b))
	}
}

// TestOversizedRecord: one write larger than the cap is cut to fit.
func TestOversizedRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	f, err := Open(path, MinMax, marker)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write([]byte("first\n"))
	big := bytes.Repeat([]byte("b"), 3*MinMax)
	if n, err := f.Write(big); err != nil || n != len(big) {
		t.Fatalf("write: %d, %v", n, err)
	}
	st, _ := os.Stat(path)
	if st.Size() > MinMax {
		t.Fatalf("file has %d bytes, cap %d", st.Size(), MinMax)
	}
}

// TestAppendsToExistingAndSeesTruncation: an existing file is appended to
// and counts against the cap; a truncation by someone else (logrotate's
// copytruncate) is noticed instead of leaving a hole.
func TestAppendsToExistingAndSeesTruncation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	os.WriteFile(path, bytes.Repeat([]byte("old line\n"), 450), 0o600) // 4050 bytes
	f, err := Open(path, MinMax, marker)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := 0; i < 10; i++ {
		f.Write([]byte("new line number " + strconv.Itoa(i) + "\n"))
	}
	b, _ := os.ReadFile(path)
	if !bytes.HasPrefix(b, []byte("CUT ")) || !bytes.HasSuffix(b, []byte("new line number 9\n")) || len(b) > MinMax {
		t.Fatalf("existing content not capped: %d bytes, starts %q", len(b), b[:10])
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		f.Write([]byte("after truncation " + strconv.Itoa(i) + "\n"))
	}
	b, _ = os.ReadFile(path)
	if bytes.IndexByte(b, 0) >= 0 || len(b) > MinMax {
		t.Fatalf("after an outside truncation: %d bytes, NUL hole %v", len(b), bytes.IndexByte(b, 0) >= 0)
	}
}

// TestPipeIsNotCapped: a non-regular file (here a pipe) is written to as
// is.
func TestPipeIsNotCapped(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f, err := Open(fmt.Sprintf("/proc/self/fd/%d", w.Fd()), MinMax, marker)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for i := 0; i < 100; i++ {
			f.Write(bytes.Repeat([]byte("p"), 99))
			f.Write([]byte("\n"))
		}
		f.Close()
	}()
	var got bytes.Buffer
	got.ReadFrom(r)
	if got.Len() != 100*100 || bytes.Contains(got.Bytes(), []byte("CUT")) {
		t.Fatalf("pipe got %d bytes (want 10000, no marker)", got.Len())
	}
}

func TestOpenRejectsTinyCap(t *testing.T) {
	if _, err := Open(filepath.Join(t.TempDir(), "log"), MinMax-1, nil); err == nil {
		t.Fatal("a cap below MinMax was accepted")
	}
}

// TestUncappedWriterLeavesNoHole: the daemon's standard error is a
// duplicate of the log's descriptor (a Go panic lands there, uncapped).
// A write through it while a cut is under way must still go to the end
// of the file: had the shared descriptor left append mode for the cut,
// one landing after the cut's truncation would go to the old end and
// leave a run of NUL bytes in the log.
func TestUncappedWriterLeavesNoHole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	f, err := Open(path, 4096, marker)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stderr, err := unix.Dup(int(f.File().Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(stderr)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			unix.Write(stderr, []byte("stderr line\n"))
		}
	}()
	line := []byte(strings.Repeat("y", 60) + "\n")
	for range 20000 {
		if _, err := f.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		t.Fatalf("NUL byte at %d of %d: a write landed past the end of the cut file", i, len(b))
	}
}
