package initramfs

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Modules are the kernel modules the guest needs for virtio-net, in insmod
// order (dependencies first). Ones the kernel has built in are skipped.
var Modules = []string{
	"virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev",
	"virtio_pci", "failover", "net_failover", "virtio_net",
}

// AgentPath is where the agent sits in the image; /init execs it.
const AgentPath = "/agent"

// formatVersion changes whenever the image layout changes, so that cached
// images built by older code are not reused.
const formatVersion = "vunet-initramfs-2"

// Options selects the inputs of an image. Zero values pick the host's.
type Options struct {
	KernelVersion string // default: newest /boot/vmlinuz-* that has /lib/modules/<version>
	BootDir       string // default /boot
	ModulesRoot   string // default /lib/modules
	Busybox       string // default /bin/busybox (Debian's busybox-static)
	Agent         string // prebuilt agent binary; default: built with BuildAgent
	CacheDir      string // default $XDG_CACHE_HOME/vunet-e2e (os.UserCacheDir)
	// Files are added to the image as they are (a test binary for the
	// agent's gotest check, say): regular files, paths absolute, outside
	// the directories the image itself fills.
	Files []File
}

// File is an extra file of the image.
type File struct {
	Path string // absolute, e.g. "/hostsock.test"
	Mode uint32 // permission bits, e.g. 0o755
	Data []byte
}

// Image is a bootable kernel and initramfs pair.
type Image struct {
	KernelVersion string
	Kernel        string // path of the kernel (the host's, not copied)
	Initrd        string // path of the cached initramfs (gzip'd newc cpio)
	Cached        bool   // the initramfs was already in the cache
}

// ErrMissing wraps errors about tools or files the host lacks; callers turn
// it into a skip or an install hint.
var ErrMissing = errors.New("missing prerequisite")

// Build assembles (or finds in the cache) the image described by opts.
func Build(ctx context.Context, opts Options) (Image, error) {
	if opts.BootDir == "" {
		opts.BootDir = "/boot"
	}
	if opts.ModulesRoot == "" {
		opts.ModulesRoot = "/lib/modules"
	}
	if opts.Busybox == "" {
		opts.Busybox = "/bin/busybox"
	}
	if opts.CacheDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		opts.CacheDir = filepath.Join(base, "vunet-e2e")
	}
	kver := opts.KernelVersion
	if kver == "" {
		var err error
		if kver, err = newestKernel(opts.BootDir, opts.ModulesRoot); err != nil {
			return Image{}, err
		}
	}
	img := Image{KernelVersion: kver, Kernel: filepath.Join(opts.BootDir, "vmlinuz-"+kver)}
	if _, err := os.Stat(img.Kernel); err != nil {
		return Image{}, fmt.Errorf("%w: kernel %s (apt-get install linux-image-amd64): %v", ErrMissing, img.Kernel, err)
	}

	busybox, err := os.ReadFile(opts.Busybox)
	if err != nil {
		return Image{}, fmt.Errorf("%w: busybox %s (apt-get install busybox-static): %v", ErrMissing, opts.Busybox, err)
	}
	applets, err := busyboxApplets(ctx, opts.Busybox)
	if err != nil {
		return Image{}, err
	}
	agentPath := opts.Agent
	if agentPath == "" {
		dir, err := os.MkdirTemp("", "vunet-agent-")
		if err != nil {
			return Image{}, fmt.Errorf("temp dir for agent: %w", err)
		}
		defer os.RemoveAll(dir)
		if agentPath, err = BuildAgent(ctx, dir); err != nil {
			return Image{}, err
		}
	}
	agent, err := os.ReadFile(agentPath)
	if err != nil {
		return Image{}, fmt.Errorf("read agent: %w", err)
	}
	mods, err := loadModules(ctx, filepath.Join(opts.ModulesRoot, kver))
	if err != nil {
		return Image{}, err
	}
	initScript := renderInit(mods)
	for _, f := range opts.Files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" || f.Path == AgentPath || f.Path == "/init" {
			return Image{}, fmt.Errorf("extra file %q: want a clean absolute path of its own", f.Path)
		}
	}

	h := sha256.New()
	for _, part := range [][]byte{[]byte(formatVersion), []byte(initScript), busybox, []byte(strings.Join(applets, "\n")), agent} {
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	for _, m := range mods {
		fmt.Fprintf(h, "%s:%d:", m.name, len(m.data))
		h.Write(m.data)
	}
	for _, f := range opts.Files {
		fmt.Fprintf(h, "file:%s:%o:%d:", f.Path, f.Mode, len(f.Data))
		h.Write(f.Data)
	}
	img.Initrd = filepath.Join(opts.CacheDir, "initramfs-"+kver+"-"+hex.EncodeToString(h.Sum(nil))[:20]+".cpio.gz")
	if st, err := os.Stat(img.Initrd); err == nil && st.Size() > 0 {
		img.Cached = true
		now := time.Now()
		_ = os.Chtimes(img.Initrd, now, now) // in use: keep it out of pruning
		return img, nil
	}

	var raw bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&raw, gzip.BestSpeed)
	cw := &newcWriter{w: zw}
	writeTree(cw, busybox, applets, agent, mods, initScript, opts.Files)
	if err := cw.close(); err != nil {
		return Image{}, err
	}
	if err := zw.Close(); err != nil {
		return Image{}, fmt.Errorf("gzip initramfs: %w", err)
	}
	if err := os.MkdirAll(opts.CacheDir, 0o755); err != nil {
		return Image{}, fmt.Errorf("cache dir: %w", err)
	}
	// Write then rename: concurrent test binaries may build the same image.
	tmp, err := os.CreateTemp(opts.CacheDir, ".initramfs-*")
	if err != nil {
		return Image{}, fmt.Errorf("cache file: %w", err)
	}
	if _, err := tmp.Write(raw.Bytes()); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return Image{}, fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return Image{}, fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	// Readable by others: QEMU may run as another user (libvirt-qemu).
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		os.Remove(tmp.Name())
		return Image{}, fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), img.Initrd); err != nil {
		os.Remove(tmp.Name())
		return Image{}, fmt.Errorf("publish %s: %w", img.Initrd, err)
	}
	pruneCache(opts.CacheDir, keepImages)
	return img, nil
}

// keepImages is how many images the cache keeps: every change to the agent
// makes a new one, and old ones are of no use.
const keepImages = 4

// pruneCache deletes all but the keep most recently used images.
func pruneCache(dir string, keep int) {
	matches, _ := filepath.Glob(filepath.Join(dir, "initramfs-*.cpio.gz"))
	type entry struct {
		path string
		mod  time.Time
	}
	var es []entry
	for _, m := range matches {
		if st, err := os.Stat(m); err == nil {
			es = append(es, entry{m, st.ModTime()})
		}
	}
	sort.Slice(es, func(i, j int) bool { return es[i].mod.After(es[j].mod) })
	for i := keep; i < len(es); i++ {
		_ = os.Remove(es[i].path)
	}
}

func writeTree(cw *newcWriter, busybox []byte, applets []string, agent []byte, mods []module, initScript string, files []File) {
	dirs := map[string]bool{}
	mkdirAll := func(d string) {
		var parts []string
		for p := d; p != "." && p != "/" && p != ""; p = path.Dir(p) {
			parts = append(parts, p)
		}
		for i := len(parts) - 1; i >= 0; i-- {
			if !dirs[parts[i]] {
				dirs[parts[i]] = true
				cw.dir(parts[i])
			}
		}
	}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "dev", "proc", "sys", "run", "tmp", "etc", "lib/modules"} {
		mkdirAll(d)
	}
	// The kernel opens /dev/console for init before anything mounts devtmpfs.
	cw.charDev("dev/console", 0o600, 5, 1)
	cw.file("bin/busybox", 0o755, busybox)
	links := map[string]bool{"bin/busybox": true, "init": true}
	for _, full := range applets {
		name := path.Base(full)
		for _, l := range []string{"bin/" + name, full} {
			if links[l] {
				continue
			}
			links[l] = true
			mkdirAll(path.Dir(l))
			cw.symlink(l, "/bin/busybox")
		}
	}
	for _, m := range mods {
		cw.file("lib/modules/"+m.name+".ko", 0o644, m.data)
	}
	cw.file(strings.TrimPrefix(AgentPath, "/"), 0o755, agent)
	cw.symlink("bin/vunet-dhcp-hook", AgentPath)
	for _, f := range files {
		p := strings.TrimPrefix(f.Path, "/")
		mkdirAll(path.Dir(p))
		cw.file(p, f.Mode&0o7777, f.Data)
	}
	cw.file("init", 0o755, []byte(initScript))
}

// renderInit writes /init: mount the pseudo file systems, load the modules,
// hand PID 1 to the agent. Failures are printed and the agent still runs,
// so the test sees a failing check rather than a silent hang.
func renderInit(mods []module) string {
	var b strings.Builder
	b.WriteString("#!/bin/busybox sh\n")
	b.WriteString("export PATH=/bin:/sbin:/usr/bin:/usr/sbin\n")
	b.WriteString("mount -t proc proc /proc\nmount -t sysfs sysfs /sys\nmount -t devtmpfs devtmpfs /dev\n")
	for _, m := range mods {
		fmt.Fprintf(&b, "insmod /lib/modules/%s.ko || echo 'VUNET-INIT insmod %s failed'\n", m.name, m.name)
	}
	fmt.Fprintf(&b, "exec %s\n", AgentPath)
	return b.String()
}

type module struct {
	name string
	data []byte // uncompressed .ko
}

// loadModules finds each of Modules under dir, decompressing .ko.xz/.ko.zst/
// .ko.gz on the host so that the guest's busybox insmod never has to.
func loadModules(ctx context.Context, dir string) ([]module, error) {
	builtin, _ := os.ReadFile(filepath.Join(dir, "modules.builtin"))
	index := map[string]string{}
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		base := d.Name()
		if i := strings.Index(base, ".ko"); i > 0 {
			index[strings.ReplaceAll(base[:i], "-", "_")] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: modules of this kernel in %s (apt-get install linux-image-amd64): %v", ErrMissing, dir, err)
	}
	var mods []module
	for _, name := range Modules {
		p, ok := index[name]
		if !ok {
			if bytes.Contains(builtin, []byte("/"+name+".ko\n")) {
				continue
			}
			return nil, fmt.Errorf("%w: module %s not found under %s", ErrMissing, name, dir)
		}
		data, err := readModule(ctx, p)
		if err != nil {
			return nil, err
		}
		mods = append(mods, module{name: name, data: data})
	}
	return mods, nil
}

func readModule(ctx context.Context, p string) ([]byte, error) {
	var tool string
	switch {
	case strings.HasSuffix(p, ".ko"):
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read module: %w", err)
		}
		return b, nil
	case strings.HasSuffix(p, ".ko.gz"):
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("read module: %w", err)
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("gunzip %s: %w", p, err)
		}
		var b bytes.Buffer
		if _, err := b.ReadFrom(zr); err != nil {
			return nil, fmt.Errorf("gunzip %s: %w", p, err)
		}
		return b.Bytes(), nil
	case strings.HasSuffix(p, ".ko.xz"):
		tool = "xz"
	case strings.HasSuffix(p, ".ko.zst"):
		tool = "zstd"
	default:
		return nil, fmt.Errorf("module %s: unknown compression", p)
	}
	out, err := exec.CommandContext(ctx, tool, "-dc", p).Output()
	if err != nil {
		return nil, fmt.Errorf("%w: decompress %s with %s (apt-get install xz-utils zstd): %v", ErrMissing, p, tool, err)
	}
	return out, nil
}

func busyboxApplets(ctx context.Context, busybox string) ([]string, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s --list-full (apt-get install busybox-static): %v", ErrMissing, busybox, err)
	}
	var applets []string
	for _, l := range strings.Fields(string(out)) {
		l = strings.TrimPrefix(path.Clean("/"+l), "/")
		if l != "" && l != "." && !strings.HasPrefix(l, "..") {
			applets = append(applets, l)
		}
	}
	sort.Strings(applets)
	for _, need := range []string{"sh", "mount", "insmod", "udhcpc", "ip", "ping"} {
		found := false
		for _, a := range applets {
			if path.Base(a) == need {
				found = true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("%w: busybox %s lacks applet %s", ErrMissing, busybox, need)
		}
	}
	return applets, nil
}

// newestKernel picks the highest-versioned kernel with both an image in
// bootDir and modules in modulesRoot.
func newestKernel(bootDir, modulesRoot string) (string, error) {
	matches, _ := filepath.Glob(filepath.Join(bootDir, "vmlinuz-*"))
	var versions []string
	for _, m := range matches {
		v := strings.TrimPrefix(filepath.Base(m), "vmlinuz-")
		if st, err := os.Stat(filepath.Join(modulesRoot, v)); err == nil && st.IsDir() {
			versions = append(versions, v)
		}
	}
	if len(versions) == 0 {
		return "", fmt.Errorf("%w: no %s/vmlinuz-* with modules in %s (apt-get install linux-image-amd64)", ErrMissing, bootDir, modulesRoot)
	}
	sort.Slice(versions, func(i, j int) bool { return versionLess(versions[i], versions[j]) })
	return versions[len(versions)-1], nil
}

// versionLess compares dotted/dashed versions numerically where it can.
func versionLess(a, b string) bool {
	split := func(s string) []string {
		return strings.FieldsFunc(s, func(r rune) bool { return r == '.' || r == '-' })
	}
	pa, pb := split(a), split(b)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		na, ea := strconv.Atoi(pa[i])
		nb, eb := strconv.Atoi(pb[i])
		if ea == nil && eb == nil {
			if na != nb {
				return na < nb
			}
			continue
		}
		if pa[i] != pb[i] {
			return pa[i] < pb[i]
		}
	}
	return len(pa) < len(pb)
}

// BuildAgent compiles vunet/test/guest/agent as a static binary into dir and
// returns its path.
func BuildAgent(ctx context.Context, dir string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "vunet-agent")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./test/guest/agent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build agent: %w: %s", err, msg)
	}
	return out, nil
}

// ModuleRoot returns the directory holding vunet's go.mod, found from this
// source file so that tests work from any package directory.
func ModuleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("module root: no caller information")
	}
	for d := filepath.Dir(file); ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("module root: no go.mod above %s", file)
		}
	}
}
