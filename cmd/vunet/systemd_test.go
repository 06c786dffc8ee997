package main

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"vunet/vhostuser"
)

// The units in contrib/, as installed: the service and the socket it
// serves.
const (
	serviceUnit = "../../contrib/vunet@.service"
	socketUnit  = "../../contrib/vunet@.socket"
)

// unitSettings reads KEY=VALUE lines of a unit file (comments and section
// headers skipped; a repeated key keeps its last value).
func unitSettings(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == '[' {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m
}

// installUnits writes both units into a directory with ExecStart pointing
// at the built binary, as `install` would put them in /etc/systemd/system.
func installUnits(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := vunetBinary(t)
	for _, u := range []string{serviceUnit, socketUnit} {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(b), "/usr/local/bin/vunet", bin)
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(u)), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestSystemdUnitsVerify: systemd-analyze verify finds nothing to say about
// the two units, and the service's command line is one vunet accepts.
func TestSystemdUnitsVerify(t *testing.T) {
	analyze := needTool(t, "systemd-analyze", "systemd")
	dir := installUnits(t)
	// Documentation=man:vunet(1): verify runs man, so the page is
	// installed where MANPATH finds it, as `make man` and install would.
	manDir := filepath.Join(t.TempDir(), "man")
	os.MkdirAll(filepath.Join(manDir, "man1"), 0o755)
	var page bytes.Buffer
	writeManPage(&page, buildInfo())
	if err := os.WriteFile(filepath.Join(manDir, "man1", "vunet.1"), page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(analyze, "verify", filepath.Join(dir, "vunet@vm1.service"), filepath.Join(dir, "vunet@vm1.socket"))
	cmd.Env = append(os.Environ(), "MANPATH="+manDir)
	out, err := cmd.CombinedOutput()
	// verify also loads the machine's units ours order against
	// (network-online.target and what it pulls in), and says what it
	// thinks of them: libvirt 11's libvirtd.service has Type=notify-reload,
	// which Debian 12's systemd 252 does not know. Those lines are about
	// the machine, not about our units.
	var ours []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "/") && !strings.HasPrefix(line, dir+"/") {
			t.Logf("about another unit on this machine: %s", line)
			continue
		}
		ours = append(ours, line)
	}
	if err != nil || len(ours) != 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, strings.Join(ours, "\n"))
	}

	svc := unitSettings(t, serviceUnit)
	args := strings.Fields(strings.NewReplacer("%i", "vm1", "$VUNET_OPTS", "--tcp-ports 2222:22").Replace(svc["ExecStart"]))[1:]
	o, err := parseFlags(args, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("the service's ExecStart %q: %v", args, err)
	}
	// The service serves the socket unit's socket: --socket must name
	// the same path, or vunet refuses the passed socket.
	sock := unitSettings(t, socketUnit)
	if want := strings.ReplaceAll(sock["ListenStream"], "%i", "vm1"); o.socket != want {
		t.Errorf("service --socket %q, socket unit ListenStream=%q", o.socket, want)
	}
	for k, want := range map[string]string{
		"Type": "notify", "NotifyAccess": "main", "Requires": "vunet@%i.socket",
		"ProtectProc": "invisible", "PrivateIPC": "yes", "UMask": "0077", "DynamicUser": "yes",
	} {
		if svc[k] != want {
			t.Errorf("service %s=%q, want %q", k, svc[k], want)
		}
	}
	if sock["SocketMode"] != "0660" || sock["Accept"] != "no" {
		t.Errorf("socket unit SocketMode=%q Accept=%q, want 0660 and no", sock["SocketMode"], sock["Accept"])
	}
}

// TestSystemdUnitFDLimit: LimitNOFILE covers what the service's defaults
// can open: a host socket per flow (--max-tcp-flows 4096 and --max-flows
// 1024 per queue pair) plus vunet's own descriptors.
func TestSystemdUnitFDLimit(t *testing.T) {
	svc := unitSettings(t, serviceUnit)
	limit, err := strconv.Atoi(svc["LimitNOFILE"])
	if err != nil {
		t.Fatalf("LimitNOFILE=%q: %v", svc["LimitNOFILE"], err)
	}
	const perPair, own = 4096 + 1024, 256
	if limit < perPair+own {
		t.Errorf("LimitNOFILE=%d, one queue pair at the default flow limits needs %d", limit, perPair+own)
	}
	// The figure the unit's comment promises.
	if limit < 12*perPair+own {
		t.Errorf("LimitNOFILE=%d does not cover the 12 queue pairs its comment promises (%d)", limit, 12*perPair+own)
	}
}

var exposureRE = regexp.MustCompile(`Overall exposure level for vunet@vm1\.service: ([0-9.]+) `)

// TestSystemdUnitSecurity: systemd-analyze security rates the service, the
// score is the one README reports, and the settings this unit exists for
// are rated as set.
func TestSystemdUnitSecurity(t *testing.T) {
	analyze := needTool(t, "systemd-analyze", "systemd")
	dir := installUnits(t)
	out, err := exec.Command(analyze, "security", "--offline=true", filepath.Join(dir, "vunet@vm1.service")).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := exposureRE.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no overall exposure level in:\n%s", out)
	}
	score := string(m[1])
	for _, want := range []string{"ProtectProc=", "UMask=", "NoNewPrivileges=", "ProtectSystem=", "PrivateDevices=", "MemoryDenyWriteExecute=", "User=/DynamicUser="} {
		if !regexp.MustCompile(`(?m)^✓ ` + regexp.QuoteMeta(want)).Match(out) {
			t.Errorf("systemd-analyze security does not rate %s as set", want)
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(readme, []byte("exposure level "+score+" ")) {
		t.Errorf("README should report `systemd-analyze security` exposure level %s (\"exposure level %s \")", score, score)
	}
	t.Logf("exposure level %s", score)
}

// TestSocketActivationAndReadiness runs vunet as systemd would with the
// units in contrib/: systemd-socket-activate binds the socket, a front-end
// connects before vunet runs, and vunet, started with the socket as
// LISTEN_FDS, serves that very connection and reports READY=1 with its
// pid on a test NOTIFY_SOCKET. On SIGTERM it exits 0 and leaves the
// socket file, which is systemd's, in place.
func TestSocketActivationAndReadiness(t *testing.T) {
	ssa := needTool(t, "systemd-socket-activate", "systemd")
	bin := vunetBinary(t)
	dir := t.TempDir()
	sock, notify := filepath.Join(dir, "vunet.sock"), filepath.Join(dir, "notify")
	nl, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()

	cmd := exec.Command(ssa, "-l", sock, "-E", "NOTIFY_SOCKET="+notify,
		bin, "--socket", sock, "--log-format", "json")
	var logs lockedBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.WaitDelay = 2 * time.Second // a child left holding the output must not hang the test
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	defer func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("systemd-socket-activate and vunet:\n%s", logs.String())
		}
	}()
	waitFile(t, sock)

	// The front-end's connection comes first; vunet is started by it.
	c := dialUnix(t, sock)
	defer c.Close()

	nl.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	n, err := nl.Read(buf)
	if err != nil {
		t.Fatalf("no notification on NOTIFY_SOCKET: %v", err)
	}
	msg := string(buf[:n])
	if !slices.Contains(strings.Split(msg, "\n"), "READY=1") {
		t.Errorf("notification %q lacks READY=1", msg)
	}
	// systemd-socket-activate execs vunet in its own process.
	if mp := "MAINPID=" + strconv.Itoa(cmd.Process.Pid); !slices.Contains(strings.Split(msg, "\n"), mp) {
		t.Errorf("notification %q lacks %s", msg, mp)
	}

	// vunet answers on the connection made before it ran: GET_FEATURES.
	req := make([]byte, vhostuser.HeaderSize)
	vhostuser.Header{Request: vhostuser.ReqGetFeatures, Flags: 1}.Encode(req)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, vhostuser.HeaderSize+8)
	if _, err := io.ReadFull(c, reply); err != nil {
		t.Fatalf("GET_FEATURES reply: %v", err)
	}
	if r := binary.LittleEndian.Uint32(reply); r != uint32(vhostuser.ReqGetFeatures) {
		t.Errorf("reply to request %d", r)
	}
	if f := binary.LittleEndian.Uint64(reply[vhostuser.HeaderSize:]); f&(1<<30) == 0 {
		t.Errorf("features %#x lack VHOST_USER_F_PROTOCOL_FEATURES", f)
	}
	c.Close()

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		if waitErr != nil {
			t.Errorf("vunet exit: %v", waitErr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("vunet did not exit on SIGTERM")
	}
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("the socket file, systemd's, was removed by vunet: %v", err)
	}
}
