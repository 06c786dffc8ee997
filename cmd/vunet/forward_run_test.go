package main

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestUDPForwardBound: -u binds the port at start-up (the daemon holds it)
// and names it on the start-up line.
func TestUDPForwardBound(t *testing.T) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	port := c.LocalAddr().(*net.UDPAddr).Port
	c.Close()
	sock := filepath.Join(t.TempDir(), "v.sock")
	spec := fmt.Sprintf("127.0.0.1/%d:53", port)
	d := startDaemon(t, "-s", sock, "-u", spec, "-t", spec)
	start := d.waitMsg(t, "vunet starting", 10*time.Second)
	if fw, _ := start["udp_forwards"].(string); !strings.Contains(fw, strconv.Itoa(port)) {
		t.Errorf("udp_forwards %q, want port %d", fw, port)
	}
	if c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}); err == nil {
		c.Close()
		t.Errorf("UDP port %d not held by the daemon", port)
	}
	if c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		t.Errorf("TCP forward on the same port: %v", err)
	} else {
		c.Close()
	}
}
