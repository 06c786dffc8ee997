package isolation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"
)

// keeperTimeout bounds each exchange with the keeper: it answers at once
// or is gone.
const keeperTimeout = 5 * time.Second

// keeper is the daemon's side of the keeper process (keeper_main.go).
type keeper struct {
	cmd   *exec.Cmd
	conn  *net.UnixConn
	log   *slog.Logger
	ready keeperReady

	mu      sync.Mutex // one exchange (dial, cleanup) at a time
	replies chan reply
	gone    chan struct{} // closed when the control socket ends
	closing bool
}

// reply is the keeper's answer to a dial or cleanup.
type reply struct {
	op      byte
	payload string
	fd      int
}

// startKeeper re-executes this binary as the keeper, hands it cfg and
// waits until it has confined itself.
func startKeeper(cfg keeperConfig, log *slog.Logger) (*keeper, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("keeper socket pair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "keeper"), os.NewFile(uintptr(fds[1]), "keeper")
	defer theirs.Close()
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"vunet-keeper"}
	// The first ExtraFiles entry is descriptor 3 in the child; nothing
	// else of ours is inherited (Go opens everything close-on-exec).
	cmd.Env = []string{keeperEnv + "=3"}
	cmd.ExtraFiles = []*os.File{theirs}
	// Standard streams are /dev/null: the daemon's may be a launcher's
	// pipe that its caller reads to the end (passt's background start),
	// which the keeper must not hold open. The keeper reports through the
	// control socket; if it dies, the daemon logs its exit status.
	if err := cmd.Start(); err != nil {
		ours.Close()
		return nil, fmt.Errorf("start keeper: %w", err)
	}
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		killKeeper(cmd)
		return nil, fmt.Errorf("keeper socket: %w", err)
	}
	k := &keeper{cmd: cmd, conn: fc.(*net.UnixConn), log: log, replies: make(chan reply, 1), gone: make(chan struct{})}
	b, _ := json.Marshal(cfg)
	if err := k.send(opConfig, b, -1); err != nil {
		k.conn.Close()
		killKeeper(cmd)
		return nil, fmt.Errorf("configure keeper: %w", err)
	}
	op, payload, _, err := k.recv(make([]byte, 64<<10), time.Now().Add(keeperTimeout))
	if err == nil && op == opFailed {
		err = fmt.Errorf("keeper could not confine itself: %s", payload)
	} else if err == nil && op != opReady {
		err = fmt.Errorf("keeper answered %q", op)
	}
	if err == nil {
		err = json.Unmarshal(payload, &k.ready)
	}
	if err != nil {
		k.conn.Close()
		killKeeper(cmd)
		return nil, err
	}
	k.conn.SetReadDeadline(time.Time{})
	go k.read()
	return k, nil
}

func killKeeper(cmd *exec.Cmd) {
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// pid is the keeper's process ID.
func (k *keeper) pid() int { return k.cmd.Process.Pid }

// send writes one message to the keeper.
func (k *keeper) send(op byte, payload []byte, fd int) error {
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	_, _, err := k.conn.WriteMsgUnix(append([]byte{op}, payload...), oob, nil)
	return err
}

// recv reads one message from the keeper.
func (k *keeper) recv(buf []byte, deadline time.Time) (op byte, payload []byte, fd int, err error) {
	k.conn.SetReadDeadline(deadline)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := k.conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, nil, -1, err
	}
	fd = rightsFD(oob[:oobn])
	if n == 0 {
		if fd >= 0 {
			unix.Close(fd)
		}
		return 0, nil, -1, errPeerGone
	}
	return buf[0], buf[1:n], fd, nil
}

// read logs the keeper's refusal reports, each system call once, and
// passes replies on, until the keeper goes away.
func (k *keeper) read() {
	defer close(k.gone)
	names, native := syscallNames()
	logged := map[int]bool{}
	buf := make([]byte, 4096)
	for {
		op, payload, fd, err := k.recv(buf, time.Time{})
		if err != nil {
			break
		}
		switch op {
		case opRefused:
			nr, a, err := parseRefusal(payload)
			if err != nil || logged[nr] {
				continue
			}
			logged[nr] = true
			name := names[nr]
			if a != native {
				// Another ABI (a 32-bit call): our table does not apply.
				name = fmt.Sprintf("#%d (audit arch %#x)", nr, a)
			} else if name == "" {
				name = "#" + strconv.Itoa(nr)
			}
			k.log.Warn("sandbox refused a system call", "syscall", name, "nr", nr, "errno", "EPERM", "logged", "once per system call",
				"hint", "a vunet feature needs a call its seccomp allow-list lacks: please report it; --sandbox=off is the debugging workaround")
		case opDialed, opDialErr, opCleanedUp:
			select {
			case k.replies <- reply{op: op, payload: string(payload), fd: fd}:
			default:
				if fd >= 0 {
					unix.Close(fd) // nobody asked: drop
				}
			}
		default:
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}
	k.mu.Lock()
	closing := k.closing
	k.mu.Unlock()
	err := k.cmd.Wait()
	if !closing {
		k.log.Error("sandbox keeper exited: system calls outside the allow-list now fail with ENOSYS unlogged, and the socket and pid file stay at exit",
			"keeper_pid", k.pid(), "status", fmt.Sprint(err))
	}
}

// exchange sends a request and waits up to timeout for its reply.
func (k *keeper) exchange(ctx context.Context, op byte, timeout time.Duration) (reply, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	// A reply that came after its request timed out must not answer this
	// one.
	select {
	case r := <-k.replies:
		if r.fd >= 0 {
			unix.Close(r.fd)
		}
	default:
	}
	if err := k.send(op, nil, -1); err != nil {
		return reply{}, fmt.Errorf("sandbox keeper: %w", err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-k.replies:
		return r, nil
	case <-k.gone:
		return reply{}, errors.New("sandbox keeper exited")
	case <-t.C:
		return reply{}, errors.New("sandbox keeper did not answer")
	case <-ctx.Done():
		return reply{}, ctx.Err()
	}
}

// dial asks the keeper for a connection to the --connect socket.
func (k *keeper) dial(ctx context.Context) (*net.UnixConn, error) {
	r, err := k.exchange(ctx, opDial, keeperTimeout)
	if err != nil {
		return nil, err
	}
	if r.op != opDialed || r.fd < 0 {
		if r.fd >= 0 {
			unix.Close(r.fd)
		}
		return nil, fmt.Errorf("dial through the sandbox keeper: %s", r.payload)
	}
	f := os.NewFile(uintptr(r.fd), "vhost-user")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// cleanupTimeout bounds the wait for the keeper's clean-up at exit; the
// keeper removes the files anyway once the daemon has gone, this only
// makes it happen before the exit. Shutdown must stay within 2 s.
const cleanupTimeout = 500 * time.Millisecond

// cleanup has the keeper remove the daemon's files now.
func (k *keeper) cleanup() error {
	r, err := k.exchange(context.Background(), opCleanup, cleanupTimeout)
	if err != nil {
		return err
	}
	if r.payload != "" {
		return errors.New(r.payload)
	}
	return nil
}

// close ends the conversation; the keeper exits when the daemon does.
func (k *keeper) close() {
	k.mu.Lock()
	k.closing = true
	k.mu.Unlock()
}

// syscallNames maps this architecture's system call numbers to names and
// says its audit architecture.
func syscallNames() (map[int]string, uint32) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, 0
	}
	return info.SyscallNumbers, uint32(info.ID)
}
