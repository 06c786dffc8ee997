package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
)

// TestQEMUGuestHTTPDownload has the guest download a random blob from an
// HTTP server on the host's loopback through the gateway address (vunet maps
// connections to the gateway to the host's loopback by default, DESIGN.md),
// and checks every byte arrived: size and SHA-256 must match what was served.
// Under TCG the guest is the bottleneck; the rate is logged, not asserted.
func TestQEMUGuestHTTPDownload(t *testing.T) {
	NeedQEMU(t)
	host, err := HostDefaults()
	if err != nil {
		Unavailable(t, err, "a host with an IPv4 default route")
	}
	const size = 32 << 20
	blob := make([]byte, size)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(blob)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		_, _ = w.Write(blob)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	d := StartDaemon(t, DaemonConfig{})
	vm := StartVM(t, VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckHTTP},
		Params: map[string]string{
			guest.ParamHTTP:    fmt.Sprintf("http://%s:%d/blob", host.Gateway, port),
			guest.ParamTimeout: "90s",
		},
		Timeout: 3 * time.Minute,
	})
	r := vm.RequireResult(t, guest.CheckHTTP, 150*time.Second)
	if r.Fields["bytes"] != strconv.Itoa(size) || r.Fields["sha256"] != hex.EncodeToString(sum[:]) {
		t.Errorf("guest got %s bytes with sha256 %s, want %d bytes with %x", r.Fields["bytes"], r.Fields["sha256"], size, sum)
	}
	t.Logf("guest download: %s Mbit/s (TCG guest; not a back-end benchmark)", r.Fields["mbps"])
	vm.Finish(t)
}

// TestQEMUGuestPing pings the gateway from the guest; vunet answers it
// through a host ICMP (ping) socket towards the host's loopback.
func TestQEMUGuestPing(t *testing.T) {
	NeedQEMU(t)
	if _, err := HostDefaults(); err != nil {
		Unavailable(t, err, "a host with an IPv4 default route")
	}
	allowPingSockets(t)
	d := StartDaemon(t, DaemonConfig{})
	vm := StartVM(t, VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckPing},
	})
	r := vm.RequireResult(t, guest.CheckPing, 90*time.Second)
	if r.Fields["received"] != r.Fields["sent"] {
		t.Errorf("ping: %s of %s answered", r.Fields["received"], r.Fields["sent"])
	}
	vm.Finish(t)
}

const pingGroupRange = "/proc/sys/net/ipv4/ping_group_range"

// allowPingSockets makes sure the daemon may open ICMP ping sockets. Linux
// refuses them to everyone, root included, while ping_group_range is the
// default "1 0" (FIELD-NOTES.md); as root the test widens it for its
// duration and restores it afterwards.
func allowPingSockets(t *testing.T) {
	t.Helper()
	raw, err := os.ReadFile(pingGroupRange)
	if err != nil {
		Unavailable(t, err, "a Linux host with ping sockets")
	}
	var lo, hi int
	if _, err := fmt.Sscanf(string(raw), "%d %d", &lo, &hi); err != nil {
		t.Fatalf("%s: %q: %v", pingGroupRange, raw, err)
	}
	if gid := os.Getegid(); lo <= gid && gid <= hi {
		return
	}
	if err := os.WriteFile(pingGroupRange, []byte("0 2147483647"), 0); err != nil {
		Unavailable(t, fmt.Errorf("ping sockets refused (%s is %q) and cannot widen it: %w", pingGroupRange, strings.TrimSpace(string(raw)), err),
			"run as root or: sysctl -w net.ipv4.ping_group_range='0 2147483647'")
	}
	t.Cleanup(func() { _ = os.WriteFile(pingGroupRange, raw, 0) })
}
