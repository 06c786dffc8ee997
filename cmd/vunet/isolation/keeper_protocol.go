package isolation

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// The daemon and its keeper talk over a SOCK_SEQPACKET socket pair (one
// message per operation, descriptors as SCM_RIGHTS). The first byte of a
// message is its operation.
const (
	// daemon → keeper
	opConfig   = 'C' // JSON keeperConfig, first message
	opListener = 'L' // the seccomp notification descriptor (SCM_RIGHTS)
	opDial     = 'D' // connect to the --connect socket
	opCleanup  = 'X' // the daemon exits: remove its files now

	// keeper → daemon
	opReady     = 'R' // JSON keeperReady
	opFailed    = 'F' // text: the keeper could not confine itself and exits
	opRefused   = 'S' // u32 system call number, u32 audit arch: a filter miss
	opDialed    = 'd' // the connected socket (SCM_RIGHTS)
	opDialErr   = 'e' // text: why the connect failed
	opCleanedUp = 'x' // text: files that could not be removed, if any
)

// keeperEnv marks the keeper's process; its value is the control socket's
// descriptor number.
const keeperEnv = "VUNET_ISOLATION_KEEPER"

// keeperConfig is what the daemon tells its keeper.
type keeperConfig struct {
	// Remove are files the daemon created before the sandbox, removed
	// when it exits if they are still the same files.
	Remove []FileID `json:"remove,omitempty"`
	// Connect is the --connect socket, dialled for the daemon.
	Connect string `json:"connect,omitempty"`
	// UID and GID are the daemon's identity after the sandbox; a keeper
	// with nothing to remove or dial takes it too.
	UID int `json:"uid"`
	GID int `json:"gid"`
}

// keeperReady is the keeper's answer once it is confined.
type keeperReady struct {
	UID   int      `json:"uid"`
	Notes []string `json:"notes,omitempty"` // what it could not apply to itself
}

// FileID names a file by path and identity, so that a successor's file at
// the same path is left alone.
type FileID struct {
	Path string `json:"path"`
	Dev  uint64 `json:"dev"`
	Ino  uint64 `json:"ino"`
}

// IdentifyFile returns the identity of the file at path (not following a
// final symbolic link).
func IdentifyFile(path string) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return FileID{}, err
	}
	return FileID{Path: path, Dev: uint64(st.Dev), Ino: uint64(st.Ino)}, nil
}

// removeIfSame removes f if the path still names the same file.
func removeIfSame(f FileID) error {
	var st unix.Stat_t
	if err := unix.Lstat(f.Path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if uint64(st.Dev) != f.Dev || uint64(st.Ino) != f.Ino {
		return nil // replaced by a successor: theirs now
	}
	if err := unix.Unlink(f.Path); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// sendMsg sends one message, with a descriptor when fd >= 0.
func sendMsg(sock int, op byte, payload []byte, fd int, flags int) error {
	msg := append([]byte{op}, payload...)
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	return unix.Sendmsg(sock, msg, oob, nil, flags)
}

// recvMsg receives one message and the descriptor it carries, if any
// (-1). A closed peer is io.EOF's syscall equivalent: n == 0.
func recvMsg(sock int, buf []byte) (op byte, payload []byte, fd int, err error) {
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return 0, nil, -1, err
		}
		if n == 0 {
			return 0, nil, -1, errPeerGone
		}
		return buf[0], buf[1:n], rightsFD(oob[:oobn]), nil
	}
}

// errPeerGone: the other end closed the control socket.
var errPeerGone = errors.New("peer closed the control socket")

// rightsFD returns the first descriptor in oob and closes any others.
func rightsFD(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return -1
	}
	fd := -1
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, f := range fds {
			if fd < 0 {
				fd = f
			} else {
				unix.Close(f)
			}
		}
	}
	return fd
}

// refusal encodes a filter miss for the daemon's log.
func refusal(nr int32, arch uint32) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint32(b, uint32(nr))
	binary.LittleEndian.PutUint32(b[4:], arch)
	return b
}

// parseRefusal decodes refusal.
func parseRefusal(b []byte) (nr int, arch uint32, err error) {
	if len(b) != 8 {
		return 0, 0, fmt.Errorf("refusal message of %d bytes", len(b))
	}
	return int(int32(binary.LittleEndian.Uint32(b))), binary.LittleEndian.Uint32(b[4:]), nil
}
