package tcpstack

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// linkService answers a guest frame itself (ARP, DHCP, DHCPv6, NDP): it writes
// a reply frame into out and returns its length, 0 for no reply. It must not
// allocate and must not keep frame or out.
type linkService interface {
	Handle(frame []byte, out []byte) (n int)
}

// loop is the event loop of one queue pair. Everything but stop and the
// atomics is touched only by the loop's own goroutine.
type loop struct {
	s   *Stack
	qp  QueuePair
	st  *QueueStats
	log *slog.Logger

	epfd, wakefd, timerfd int
	txKick, rxKick        int // kick eventfds, -1 when the front-end polls
	polling               bool
	events                [64]unix.EpollEvent

	quit atomic.Bool
	done chan struct{}

	svc       [NumServices]linkService
	tx        txPath
	rx        rxWriter
	pending   replyRing
	rxWaiting bool // frames wait for RX descriptors: RX kicks are enabled
	txMore    bool // TX budget ran out: come back without sleeping
}

// pollIntervalNs is how often the rings are polled when the front-end gave no
// kick eventfd (vhost-user "no fd" flag).
const pollIntervalNs = 1_000_000

func newLoop(s *Stack, qp QueuePair, st *QueueStats) (*loop, error) {
	l := &loop{
		s:       s,
		qp:      qp,
		st:      st,
		log:     s.log.With("pair", qp.Index),
		epfd:    -1,
		wakefd:  -1,
		timerfd: -1,
		txKick:  qp.TX.KickFD(),
		rxKick:  qp.RX.KickFD(),
		done:    make(chan struct{}),
	}
	l.rx.init(qp.RX, st, l.log, qp.Features)
	l.svc = s.newServices()
	if err := l.openFDs(); err != nil {
		l.closeFDs()
		if l.wakefd >= 0 {
			unix.Close(l.wakefd)
		}
		return nil, err
	}
	return l, nil
}

func (l *loop) openFDs() error {
	var err error
	if l.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("epoll_create1: %w", err)
	}
	if l.wakefd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return fmt.Errorf("wake eventfd: %w", err)
	}
	if l.timerfd, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC); err != nil {
		return fmt.Errorf("timerfd_create: %w", err)
	}
	for _, fd := range [...]int{l.wakefd, l.timerfd, l.txKick, l.rxKick} {
		if fd < 0 {
			continue
		}
		if err := l.watch(fd, unix.EPOLLIN); err != nil {
			return fmt.Errorf("epoll add fd %d: %w", fd, err)
		}
	}
	if l.txKick < 0 || l.rxKick < 0 {
		l.polling = true
		ts := unix.NsecToTimespec(pollIntervalNs)
		spec := unix.ItimerSpec{Interval: ts, Value: ts}
		if err := unix.TimerfdSettime(l.timerfd, 0, &spec, nil); err != nil {
			return fmt.Errorf("arm poll timer: %w", err)
		}
	}
	return nil
}

func (l *loop) watch(fd int, events uint32) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(fd)}
	return unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev)
}

// closeFDs closes the loop's own fds. The wake fd is closed by stop (or
// newLoop's failure path) instead: stop writes to it while the loop may be
// exiting.
func (l *loop) closeFDs() {
	for _, p := range [...]*int{&l.epfd, &l.timerfd} {
		if *p >= 0 {
			unix.Close(*p)
			*p = -1
		}
	}
}

// stop asks the loop to finish and waits until it has left the rings.
func (l *loop) stop() {
	l.quit.Store(true)
	l.wake()
	<-l.done
	unix.Close(l.wakefd)
	l.wakefd = -1
}

// wake interrupts epoll_wait from another goroutine.
func (l *loop) wake() {
	var one = [8]byte{1}
	if _, err := unix.Write(l.wakefd, one[:]); err != nil && !errors.Is(err, unix.EAGAIN) {
		l.log.Error("wake event loop", "err", err)
	}
}

// run is the loop's goroutine. It owns a locked OS thread: the loop sleeps in
// epoll_wait, a blocking system call, and the Go netpoller is not used.
func (l *loop) run() {
	runtime.LockOSThread()
	defer close(l.done)
	defer l.shutdown()

	// Only a waiting frame makes us want RX kicks.
	l.qp.RX.DisableKicks()
	// Chains may be waiting from before a restart without a kick pending.
	l.iterate(true)
	for !l.quit.Load() {
		timeout := -1
		if l.txMore {
			timeout = 0
		}
		n, err := unix.EpollWait(l.epfd, l.events[:], timeout)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			l.log.Error("epoll_wait failed, event loop stops", "err", err)
			return
		}
		l.st.Wakeups.Add(1)
		txKicked := l.txMore
		for i := 0; i < n; i++ {
			fd := int(l.events[i].Fd)
			switch fd {
			case l.wakefd:
				var b [8]byte
				unix.Read(l.wakefd, b[:])
			case l.timerfd:
				var b [8]byte
				unix.Read(l.timerfd, b[:])
				if l.polling {
					txKicked = true
				}
				l.onTimer()
			case l.txKick:
				l.qp.TX.DrainKick()
				txKicked = true
			case l.rxKick:
				// The guest refilled its RX ring; deliverPending below retries.
				l.qp.RX.DrainKick()
			default:
				l.onSocket(fd, l.events[i].Events)
			}
		}
		if l.quit.Load() {
			return
		}
		l.iterate(txKicked)
	}
}

// iterate does one round of work: guest frames, frames for the guest, and
// one publication of the RX used ring.
func (l *loop) iterate(tx bool) {
	l.txMore = false
	if tx {
		l.txMore = l.processTX()
	}
	l.deliverPending()
	l.rx.publish()
}

// queueReply makes the frame just built in l.pending.next() pending.
func (l *loop) queueReply(n int) {
	if l.pending.commit(n) {
		l.st.RX.Drops[DropPendingOverflow].Add(1)
	}
}

// deliverPending writes pending replies to the guest until none is left or the
// RX ring runs out of buffers; in the latter case RX kicks are enabled so the
// guest's refill wakes the loop at once.
func (l *loop) deliverPending() {
	for l.pending.len() > 0 {
		p := l.pending.front()
		if !l.qp.RXEnabled {
			l.st.RX.Drops[DropRingDisabled].Add(1)
			l.pending.pop()
			continue
		}
		switch l.rx.writeFrame(p.buf[:p.n], 0) {
		case rxOK:
			l.pending.pop()
		case rxNoFit:
			l.st.RX.Drops[DropNoFit].Add(1)
			l.pending.pop()
		case rxBroken:
			l.st.RX.Drops[DropQueueBroken].Add(1)
			l.pending.pop()
		case rxNoDesc:
			if !p.waited {
				p.waited = true
				l.st.RXWaitedForDescriptors.Add(1)
			}
			// Enable kicks while our reservations are still popped: with
			// EVENT_IDX avail_event then points past everything the guest has
			// posted, so its next refill kicks us even after we Unpop.
			l.rxWaiting = true
			if l.qp.RX.EnableKicks() {
				continue // the guest added buffers meanwhile: retry now
			}
			return
		}
	}
	if l.rxWaiting {
		l.rxWaiting = false
		l.qp.RX.DisableKicks()
	}
}

// shutdown leaves the rings consistent for GET_VRING_BASE and a restart:
// every TX chain was pushed in its batch; RX reservations are rewound and
// pushed chains published. Pending replies are dropped with the loop.
func (l *loop) shutdown() {
	l.rx.publish()
	if n := l.pending.len(); n > 0 {
		l.st.RX.Drops[DropRingDisabled].Add(uint64(n))
	}
	l.closeFlows()
	l.closeFDs()
}
