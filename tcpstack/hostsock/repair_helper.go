package hostsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The repair helper's protocol, passt-repair's (so either helper serves
// either daemon): the helper connects to the daemon's UNIX stream socket;
// the daemon sends one signed byte — RepairOn (1), RepairOff (0) or
// RepairOffNoWP (-1) — with 1 to 253 TCP sockets as SCM_RIGHTS; the helper
// sets TCP_REPAIR to that value on each and answers with the same byte, or
// closes the connection on failure.

// Repair modes, TCP_REPAIR's values.
const (
	RepairOn      int8 = unix.TCP_REPAIR_ON
	RepairOff     int8 = unix.TCP_REPAIR_OFF
	RepairOffNoWP int8 = unix.TCP_REPAIR_OFF_NO_WP
)

// RepairBatch is the most sockets one message carries (SCM_MAX_FD).
const RepairBatch = 253

// RepairHelperWait bounds how long Set waits for the helper to connect and
// to answer.
const RepairHelperWait = 5 * time.Second

// ErrNoRepairHelper is returned when no helper connected in time.
var ErrNoRepairHelper = errors.New("no TCP_REPAIR helper connected")

// RepairHelper is the daemon's end of the channel to the TCP_REPAIR
// helper: a listening socket made at start-up (passt's --repair-path) and
// the helper's connection once it came.
type RepairHelper struct {
	l  *net.UnixListener
	mu sync.Mutex
	c  *net.UnixConn
}

// ListenRepair listens for the helper at path (a stale socket file is
// replaced).
func ListenRepair(path string) (*RepairHelper, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("repair helper socket %s: %w", path, err)
	}
	return &RepairHelper{l: l}, nil
}

// LeaveFile makes Close leave the socket file for someone else to remove
// (a sandboxed daemon, which may unlink nothing, has its keeper do it).
func (h *RepairHelper) LeaveFile() { h.l.SetUnlinkOnClose(false) }

// Close closes the listener and the helper's connection.
func (h *RepairHelper) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.c != nil {
		h.c.Close()
		h.c = nil
	}
	return h.l.Close()
}

// Set sets TCP_REPAIR to mode on every socket of fds, through the helper,
// in batches of RepairBatch. It waits up to RepairHelperWait for a helper
// to connect if none is. The descriptors stay the caller's.
func (h *RepairHelper) Set(fds []int, mode int8) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.c == nil {
		h.l.SetDeadline(time.Now().Add(RepairHelperWait))
		c, err := h.l.AcceptUnix()
		h.l.SetDeadline(time.Time{})
		if err != nil {
			return fmt.Errorf("%w: %w", ErrNoRepairHelper, err)
		}
		h.c = c
	}
	for len(fds) > 0 {
		n := min(len(fds), RepairBatch)
		if err := h.exchange(fds[:n], mode); err != nil {
			h.c.Close()
			h.c = nil
			return err
		}
		fds = fds[n:]
	}
	return nil
}

func (h *RepairHelper) exchange(fds []int, mode int8) error {
	h.c.SetDeadline(time.Now().Add(RepairHelperWait))
	defer h.c.SetDeadline(time.Time{})
	if _, _, err := h.c.WriteMsgUnix([]byte{byte(mode)}, unix.UnixRights(fds...), nil); err != nil {
		return fmt.Errorf("repair helper: send: %w", err)
	}
	var b [1]byte
	n, err := h.c.Read(b[:])
	if err != nil || n != 1 {
		return fmt.Errorf("repair helper: no answer (it closes the connection when TCP_REPAIR fails): %v", err)
	}
	if int8(b[0]) != mode {
		return fmt.Errorf("repair helper answered %d to %d", int8(b[0]), mode)
	}
	return nil
}
