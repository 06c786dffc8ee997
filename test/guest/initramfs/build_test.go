package initramfs

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/testenv"
)

type newcEntry struct {
	mode      uint32
	rdevMajor uint32
	rdevMinor uint32
	data      []byte
}

// readNewc is an independent reader so the test checks the bytes the kernel
// will parse, not the writer's own idea of them.
func readNewc(t *testing.T, b []byte) map[string]newcEntry {
	t.Helper()
	out := map[string]newcEntry{}
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("header at %d field %d: %v", off, i, err)
		}
		return uint32(v)
	}
	for {
		if off+110 > len(b) || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad header at offset %d", off)
		}
		mode, size, maj, min, nameSize := field(1), field(6), field(9), field(10), field(11)
		nameStart := off + 110
		name := string(b[nameStart : nameStart+int(nameSize)-1])
		if b[nameStart+int(nameSize)-1] != 0 {
			t.Fatalf("name %q not NUL-terminated", name)
		}
		dataStart := (nameStart + int(nameSize) + 3) &^ 3
		data := b[dataStart : dataStart+int(size)]
		off = (dataStart + int(size) + 3) &^ 3
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after trailer", len(b)-off)
			}
			return out
		}
		if _, dup := out[name]; dup {
			t.Fatalf("duplicate entry %q", name)
		}
		out[name] = newcEntry{mode: mode, rdevMajor: maj, rdevMinor: min, data: data}
	}
}

func TestNewcWriterLayout(t *testing.T) {
	var buf bytes.Buffer
	w := &newcWriter{w: &buf}
	w.dir("bin")
	w.file("bin/x", 0o755, []byte("abcde"))
	w.symlink("bin/y", "/bin/x")
	w.charDev("dev/console", 0o600, 5, 1)
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Fatalf("archive length %d not 4-aligned", buf.Len())
	}
	got := readNewc(t, buf.Bytes())
	if e := got["bin/x"]; e.mode != modeFile|0o755 || string(e.data) != "abcde" {
		t.Errorf("bin/x = %o %q", e.mode, e.data)
	}
	if e := got["bin/y"]; e.mode != modeLink|0o777 || string(e.data) != "/bin/x" {
		t.Errorf("bin/y = %o %q", e.mode, e.data)
	}
	if e := got["dev/console"]; e.mode != modeChr|0o600 || e.rdevMajor != 5 || e.rdevMinor != 1 {
		t.Errorf("dev/console = %+v", e)
	}
	if e := got["bin"]; e.mode != modeDir|0o755 {
		t.Errorf("bin = %o", e.mode)
	}
	if cpio, err := exec.LookPath("cpio"); err == nil {
		cmd := exec.Command(cpio, "-t", "--quiet")
		cmd.Stdin = bytes.NewReader(buf.Bytes())
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("GNU cpio rejects the archive: %v", err)
		}
		if s := strings.Fields(string(out)); strings.Join(s, " ") != "bin bin/x bin/y dev/console" {
			t.Errorf("cpio -t lists %q", s)
		}
	}
}

func TestVersionLess(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{"6.1.0-9-amd64", "6.1.0-57-amd64"}, {"5.10.0-1-amd64", "6.1.0-1-amd64"}, {"6.1.0", "6.1.0-1"},
	} {
		if !versionLess(c.a, c.b) || versionLess(c.b, c.a) {
			t.Errorf("versionLess(%q, %q) wrong", c.a, c.b)
		}
	}
}

func TestBuildHostImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent and a real image: skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cache := t.TempDir()
	start := time.Now()
	img, err := Build(ctx, Options{CacheDir: cache})
	if errors.Is(err, ErrMissing) {
		testenv.Unavailable(t, err, "the apt-get line above")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s for %s in %v", img.Initrd, img.KernelVersion, time.Since(start))
	if img.Cached {
		t.Error("fresh cache dir reported a cache hit")
	}
	if st, err := os.Stat(img.Initrd); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("cached image %v mode, err %v; want 0644", st.Mode(), err)
	}
	again, err := Build(ctx, Options{CacheDir: cache})
	if err != nil || !again.Cached || again.Initrd != img.Initrd {
		t.Fatalf("second build: %+v, %v; want cache hit on %s", again, err, img.Initrd)
	}

	f, err := os.Open(img.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	files := readNewc(t, raw)
	busybox, _ := os.ReadFile("/bin/busybox")
	if e := files["bin/busybox"]; !bytes.Equal(e.data, busybox) || e.mode&0o111 == 0 {
		t.Errorf("bin/busybox: %d bytes mode %o, want the host's %d executable bytes", len(e.data), e.mode, len(busybox))
	}
	for _, l := range []string{"bin/sh", "bin/udhcpc", "bin/insmod", "bin/ip", "bin/ping"} {
		if e := files[l]; e.mode&0o170000 != modeLink || string(e.data) != "/bin/busybox" {
			t.Errorf("%s: mode %o target %q", l, e.mode, e.data)
		}
	}
	if e := files["bin/vunet-dhcp-hook"]; string(e.data) != AgentPath {
		t.Errorf("dhcp hook links to %q", e.data)
	}
	if e := files["agent"]; len(e.data) < 1<<20 || !bytes.HasPrefix(e.data, []byte("\x7fELF")) {
		t.Errorf("agent: %d bytes, want a static ELF", len(e.data))
	}
	if e := files["dev/console"]; e.mode&0o170000 != modeChr || e.rdevMajor != 5 || e.rdevMinor != 1 {
		t.Errorf("dev/console: %+v", e)
	}
	// An extra file makes another image, with the file in it.
	extra := File{Path: "/opt/t/x.test", Mode: 0o755, Data: []byte("\x7fELF extra")}
	withFile, err := Build(ctx, Options{CacheDir: cache, Files: []File{extra}})
	if err != nil || withFile.Cached || withFile.Initrd == img.Initrd {
		t.Fatalf("build with a file: %+v, %v; want a new image", withFile, err)
	}
	if e := readNewc(t, gunzipFile(t, withFile.Initrd))["opt/t/x.test"]; !bytes.Equal(e.data, extra.Data) || e.mode&0o777 != 0o755 {
		t.Errorf("extra file: %q mode %o", e.data, e.mode)
	}
	if _, err := Build(ctx, Options{CacheDir: cache, Files: []File{{Path: "agent", Data: extra.Data}}}); err == nil {
		t.Errorf("a relative extra path was taken")
	}
	init := string(files["init"].data)
	last := -1
	for _, m := range Modules {
		e, ok := files["lib/modules/"+m+".ko"]
		if !ok {
			continue // built into this kernel
		}
		if !bytes.HasPrefix(e.data, []byte("\x7fELF")) {
			t.Errorf("module %s is not an uncompressed ELF", m)
		}
		i := strings.Index(init, fmt.Sprintf("insmod /lib/modules/%s.ko", m))
		if i < last {
			t.Errorf("module %s loaded out of order in /init:\n%s", m, init)
		}
		last = i
	}
	if _, ok := files["lib/modules/virtio_net.ko"]; !ok {
		t.Errorf("virtio_net.ko missing")
	}
	if !strings.HasSuffix(init, "exec "+AgentPath+"\n") {
		t.Errorf("/init does not end by exec'ing the agent:\n%s", init)
	}
}

func TestPruneCacheKeepsNewest(t *testing.T) {
	dir := t.TempDir()
	base := time.Now().Add(-time.Hour)
	for i := 0; i < 6; i++ {
		p := fmt.Sprintf("%s/initramfs-k-%d.cpio.gz", dir, i)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		mt := base.Add(time.Duration(i) * time.Minute)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(dir+"/unrelated", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	pruneCache(dir, 4)
	for i := 0; i < 6; i++ {
		_, err := os.Stat(fmt.Sprintf("%s/initramfs-k-%d.cpio.gz", dir, i))
		if kept := err == nil; kept != (i >= 2) {
			t.Errorf("image %d kept=%v", i, kept)
		}
	}
	if _, err := os.Stat(dir + "/unrelated"); err != nil {
		t.Errorf("pruning removed an unrelated file: %v", err)
	}
}

// gunzipFile reads a gzip'd file whole.
func gunzipFile(t *testing.T, name string) []byte {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
