package tcpstack

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/dgram"
	"vunet/tcpstack/guestring"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/linksvc"
	"vunet/tcpstack/stats"
	"vunet/tcpstack/tcp"
	"vunet/virtqueue"
)

// loop is the event loop of one queue pair. Everything but quit/done and the
// stats atomics is touched only by the loop's own goroutine.
type loop struct {
	s   *Stack
	ps  *pairState
	qp  virtqueue.QueuePair
	st  *stats.Queue
	log *slog.Logger

	ep             *hostsock.Epoll
	yielder        *hostsock.Yielder // yieldToControl's (loop_wait.go)
	wakefd         int
	timerfd        int // the ring-polling timer, -1 when the front-end kicks
	txKick, rxKick int // kick eventfds, -1 when the front-end polls
	control        int // the front-end's vhost-user socket, -1: none (loop_wait.go)
	polling        bool
	pollFor        time.Duration // busy-poll before the next sleep (loop_wait.go)
	bulk           bool          // the last iteration moved bulkBytes or more: no busy-poll (loop_wait.go)
	events         [128]unix.EpollEvent

	quit atomic.Bool
	done chan struct{}

	requests requestQueue // work for the pair's tables from the control goroutine (loop_requests.go)

	link      *linksvc.Link // ARP, DHCP, DHCPv6, NDP answers and announcements
	nextRA    time.Time     // next unsolicited Router Advertisement; zero: none
	raInitial int           // initial RAs still to follow the delivered ones (replies.go)
	raGap     time.Duration // gap before the next initial RA
	tx        txPath
	rx        guestring.Writer // the RX ring's writer (queue pairs)
	out       guestOut         // where frames for the guest go: &rx, or the stream's writer
	stream    *streamLink      // the stream socket, nil for a queue pair
	pending   replyRing
	flows     *dgram.Table
	tcp       *tcp.Table
	frag      *fragPool // IP reassembly buffers (ip_reassembly.go)
	now       time.Time // taken once per iteration
	mtu       int       // guest MTU the TCP table was last told
	vhLen     int       // virtio-net header length the features give (both rings)
	guestCsum bool      // VIRTIO_NET_F_GUEST_CSUM: frames to the guest may carry partial checksums
	rxWaiting bool      // producers wait for RX descriptors: RX kicks are enabled
	tcpRXWait bool      // the TCP output is blocked on RX descriptors (counted once per wait)
	dgRXWait  bool      // the datagram output is, likewise
	again     bool      // work is left: poll epoll without sleeping

	deadline  time.Time // the earliest timer due (armTimer); zero: none
	timerRan  time.Time // the last run of the timers armTimer set (timerDue)
	lastYield time.Time // last pass through the scheduler (loop_wait.go)

	// faulted: guest memory faulted under the loop; the rings are not
	// touched again (see recoverFault).
	faulted bool
}

// guestOut is where the loop's producers put frames for the guest and
// how the loop drives it: guestring.Writer over the RX ring, or
// stream.Writer over a stream socket's send buffer.
type guestOut interface {
	guestring.Sink
	WriteFrame(frame []byte, flags uint8) guestring.Status
	BeginIteration()
	Starved() bool
	Limited() bool
	Publish()
}

// Slots of the loop's own fds in their epoll tokens (hostsock.OwnerLoop).
const (
	loopFDWake = iota + 1
	loopFDTimer
	loopFDTXKick
	loopFDRXKick
	loopFDMail // the pair's mailbox (moves.go)
	loopFDStream
	loopFDControl // the front-end's vhost-user socket (QueuePair.ControlFD)
)

// pollInterval is how often the rings are polled when the front-end gave no
// kick eventfd (vhost-user "no fd" flag).
const pollInterval = time.Millisecond

// newLoop builds the loop of queue pair qp, or, with sl, of the stream
// socket sl (qp then only names pair 0, enabled, without features).
func newLoop(s *Stack, qp virtqueue.QueuePair, ps *pairState, sl *streamLink) (*loop, error) {
	st := ps.st
	l := &loop{
		s:       s,
		ps:      ps,
		qp:      qp,
		st:      st,
		flows:   ps.flows,
		tcp:     ps.tcp,
		log:     s.log.With("pair", qp.Index),
		wakefd:  -1,
		timerfd: -1,
		txKick:  -1,
		rxKick:  -1,
		control: -1,
		done:    make(chan struct{}),
		frag:    new(fragPool),
		stream:  sl,
	}
	if sl != nil {
		// No virtio-net header on a stream, and so no offloads.
		sl.w.SetCapture(s.cfg.Capture, qp.Index)
		l.out = &sl.w
	} else {
		l.txKick, l.rxKick = qp.TX.KickFD(), qp.RX.KickFD()
		if qp.ControlFD > 0 {
			l.control = qp.ControlFD
		}
		l.rx.Init(qp.RX, st, l.log, qp.Features, qp.RXEnabled)
		l.rx.SetCapture(s.cfg.Capture, qp.Index)
		l.out = &l.rx
		l.vhLen = virtqueue.NetHdrLenFor(qp.Features)
		l.guestCsum = virtqueue.HasFeature(qp.Features, virtqueue.FeatureNetGuestCsum)
	}
	l.link = linksvc.New(&s.cfg.Addr)
	if err := l.openFDs(); err != nil {
		l.closeFDs()
		if l.wakefd >= 0 {
			unix.Close(l.wakefd)
		}
		return nil, err
	}
	l.flows.SetGuestCsum(l.guestCsum)
	l.flows.SetGuestUSO(virtqueue.HasFeature(qp.Features, virtqueue.FeatureNetGuestUSO4),
		virtqueue.HasFeature(qp.Features, virtqueue.FeatureNetGuestUSO6))
	l.flows.Attach(l.ep, time.Now())
	l.attachTCP()
	ps.loop = l
	return l, nil
}

func (l *loop) openFDs() error {
	var err error
	if l.ep, err = hostsock.NewEpoll(); err != nil {
		return err
	}
	if l.yielder, err = hostsock.NewYielder(); err != nil {
		return err
	}
	if l.wakefd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return fmt.Errorf("wake eventfd: %w", err)
	}
	if l.stream == nil && (l.txKick < 0 || l.rxKick < 0) {
		l.polling = true
		if l.timerfd, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC); err != nil {
			return fmt.Errorf("timerfd_create: %w", err)
		}
	}
	for _, w := range [...]struct {
		fd  int
		tok uint32
	}{{l.wakefd, loopFDWake}, {l.timerfd, loopFDTimer}, {l.txKick, loopFDTXKick}, {l.rxKick, loopFDRXKick}, {l.ps.mail.wake, loopFDMail}, {l.control, loopFDControl}} {
		if w.fd < 0 {
			continue
		}
		ev := uint32(unix.EPOLLIN)
		if w.tok == loopFDTXKick || w.tok == loopFDRXKick || w.tok == loopFDControl {
			// Edge-triggered: each kick is a new edge, so the counter
			// need not be read to stop the reports (CountKick); the
			// control socket is the control plane's to read.
			ev |= unix.EPOLLET
		}
		if err := l.ep.Add(w.fd, ev, hostsock.NewToken(hostsock.OwnerLoop, 0, w.tok)); err != nil {
			if w.tok == loopFDControl {
				// Only a shortcut for the control plane (loop_wait.go).
				l.log.Warn("watch the vhost-user socket", "fd", w.fd, "err", err)
				continue
			}
			return fmt.Errorf("epoll add fd %d: %w", w.fd, err)
		}
	}
	if l.stream != nil {
		return l.stream.watch(l.ep)
	}
	if l.polling {
		ts := unix.NsecToTimespec(int64(pollInterval))
		spec := unix.ItimerSpec{Interval: ts, Value: ts}
		if err := unix.TimerfdSettime(l.timerfd, 0, &spec, nil); err != nil {
			return fmt.Errorf("arm poll timer: %w", err)
		}
	}
	return nil
}

// closeFDs closes the loop's own fds. The wake fd is closed by stop (or
// newLoop's failure path) instead: stop writes to it while the loop may be
// exiting.
func (l *loop) closeFDs() {
	l.ep.Close()
	l.yielder.Close()
	if l.timerfd >= 0 {
		unix.Close(l.timerfd)
		l.timerfd = -1
	}
}

// wake interrupts epoll_wait from another goroutine.
func (l *loop) wake() {
	var one = [8]byte{1}
	if _, err := unix.Write(l.wakefd, one[:]); err != nil && !errors.Is(err, unix.EAGAIN) {
		l.log.Error("wake event loop", "err", err)
	}
}

// run is the loop's goroutine. It sleeps in epoll_wait (loop_wait.go says
// how, with the Go scheduler in mind); its own fds are not in the Go
// netpoller.
//
// Guest memory is the front-end's file, mapped shared: a front-end that
// truncates it under us turns our next touch into a SIGBUS, which kills the
// process unless this goroutine asked for faults as panics (the setting is
// per goroutine; the control goroutine has its own). recoverFault ends the
// loop instead; done is still closed, so StopPair returns.
func (l *loop) run() {
	debug.SetPanicOnFault(true)
	defer close(l.done)
	// StartPair or ServeStream counted the loop in; it counts itself out
	// before done says it stopped.
	defer reserveP(-1)
	defer l.shutdown()
	defer l.recoverFault()

	if l.stream == nil {
		// Only a producer waiting for buffers makes us want RX kicks.
		l.qp.RX.DisableKicks()
		// Each iteration signals once, at its end (shutdown stops this).
		l.qp.RX.DeferSignals(true)
		l.qp.TX.DeferSignals(true)
	}
	l.now = time.Now()
	// The tables outlive a loop: nothing gathered or queued by an earlier
	// one is written from memory this one never saw.
	l.tcp.DropSends()
	l.flows.DropSends()
	l.announceLink()
	// Chains may be waiting from before a restart without a kick pending.
	l.iterate(true)
	for !l.quit.Load() && !l.stream.ended() {
		until := l.deadline
		if l.again {
			until = l.now // past: poll without sleeping
		}
		n, err := l.wait(until)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			l.log.Error("epoll_wait failed, event loop stops", "err", err)
			return
		}
		l.st.Wakeups.Add(1)
		// Socket events below are stamped with this time.
		l.now = time.Now()
		l.yieldIfDue(l.now)
		tx := l.again
		for i := 0; i < n; i++ {
			ev := &l.events[i]
			tok := hostsock.EventToken(ev)
			if tok.Owner() != hostsock.OwnerLoop {
				l.onSocket(tok, ev.Events)
				continue
			}
			switch tok.Slot() {
			case loopFDWake:
				var b [8]byte
				unix.Read(l.wakefd, b[:])
			case loopFDTimer:
				var b [8]byte
				unix.Read(l.timerfd, b[:])
				tx = true // the ring-polling tick
				l.onTimer()
			case loopFDTXKick:
				l.qp.TX.CountKick()
				tx = true
			case loopFDRXKick:
				// The guest refilled its RX ring: the producers run in
				// every iteration and retry what waited.
				l.qp.RX.CountKick()
			case loopFDMail:
				// Another pair asks for a flow or hands one over: iterate
				// reads the mailbox.
				l.ps.mail.drainWake()
			case loopFDControl:
				// A vhost-user message: the control plane needs a P,
				// and ours is the one it can have (loop_wait.go).
				l.yieldToControl()
			case loopFDStream:
				// Readable (or hung up): the frames are read in iterate.
				// Writable: what waited for the socket goes now, and the
				// producers that waited retry in iterate.
				tx = l.stream.event(ev.Events) || tx
			}
		}
		if l.quit.Load() {
			return
		}
		if l.timerDue() {
			l.onTimer()
		}
		moved := l.st.TX.Bytes.Load() + l.st.RX.Bytes.Load()
		l.iterate(tx)
		l.bulk = l.st.TX.Bytes.Load()+l.st.RX.Bytes.Load()-moved >= bulkBytes
	}
}

// iterate does one round of work: guest frames (when tx), frames for the
// guest, and one publication of the RX used ring.
func (l *loop) iterate(tx bool) {
	l.out.BeginIteration()
	if l.requests.pending.Load() {
		l.runRequests(false)
	}
	if l.ps.mail.pending() {
		l.readMail() // flows given to us first: a frame may wait for one
	}
	txMore := false
	if tx || l.tx.fetch.resume {
		l.tx.fetch.resume = false
		txMore = l.processTX()
	}
	if len(l.ps.wants) > 0 {
		l.serveWants() // after our own TX: the guest's frames here went first
	}
	more := l.produceRX()
	// The connections' epoll masks, as the iteration left them (after the
	// last output pass: nothing below changes them).
	l.tcp.SyncEpoll()
	switch {
	case l.stream != nil:
		// A stream's writer waits for EPOLLOUT itself (streamLink.watch).
	case l.out.Starved() && l.out.Enabled():
		// Enable kicks while our reservations are still popped: with
		// EVENT_IDX avail_event then points past everything the guest has
		// posted, so its next refill kicks us even after we Unpop.
		l.rxWaiting = true
		more = l.qp.RX.EnableKicks() || more
	case l.rxWaiting:
		l.rxWaiting = false
		l.qp.RX.DisableKicks()
	}
	l.out.Publish()
	if l.stream != nil {
		l.stream.settle(l.ep)
	} else {
		// The interrupts this iteration decided on, both rings in one
		// system call (virtqueue/signal_batch.go).
		virtqueue.SignalPending(l.qp.RX, l.qp.TX)
	}
	l.again = txMore || more || l.out.Limited()
	l.armTimer()
}

// armTimer sets l.deadline to the earliest deadline of the flows, the
// router advertisements and the flow moves, for the loop's next wait to
// end at (polling mode has its periodic timer instead).
//
// The deadline is the wait's own timeout, not a timerfd: under a QEMU
// guest the deadline moves in nearly every iteration (each flight arms a
// tail-loss probe that the guest's ACK cancels), and re-arming a timerfd
// was one system call in seven of the loop's, for nothing a timeout on
// the epoll_wait it makes anyway does not do.
func (l *loop) armTimer() {
	if l.polling {
		return
	}
	d := l.flows.NextDeadline()
	for _, t := range [...]time.Time{l.tcpDeadline(), l.nextRA, l.fetchDeadline()} {
		if !t.IsZero() && (d.IsZero() || t.Before(d)) {
			d = t
		}
	}
	// Timers run at most once a millisecond: one that stays due (a
	// deadline the owner cannot act on yet) must not spin the loop. The
	// millisecond counts from the last run, not from now: a loop woken
	// more often than that would otherwise push a due timer ahead of it
	// for as long as it stays busy.
	if soonest := l.timerRan.Add(time.Millisecond); !d.IsZero() && d.Before(soonest) {
		d = soonest
	}
	l.deadline = d
}

// timerDue reports whether the deadline armTimer set has come, and if so
// takes it: the timers run now, and armTimer's floor counts from here.
func (l *loop) timerDue() bool {
	if l.deadline.IsZero() || l.now.Before(l.deadline) {
		return false
	}
	l.deadline, l.timerRan = time.Time{}, l.now
	return true
}

// onTimer runs expired timeouts.
func (l *loop) onTimer() {
	l.flows.Expire(l.now)
	l.tcp.Timers(l.now)
	l.expireFetches()
	if !l.nextRA.IsZero() && !l.now.Before(l.nextRA) {
		l.sendRA()
	}
}

// onSocket hands a socket's readiness to the socket's owner.
func (l *loop) onSocket(tok hostsock.Token, events uint32) {
	switch tok.Owner() {
	case hostsock.OwnerUDP, hostsock.OwnerICMP, hostsock.OwnerUDPForward:
		l.flows.Ready(tok)
	case hostsock.OwnerTCP, hostsock.OwnerTCPListener:
		l.tcp.HandleSocketEvent(l.now, tok, events)
	}
}

// attachTCP hands the pair's connections to this loop: their sockets join
// its epoll set, and they learn the guest's offloads and MTU.
func (l *loop) attachTCP() {
	f := l.qp.Features
	l.tcp.Attach(l.ep)
	l.tcp.SetFeatures(l.guestCsum,
		virtqueue.HasFeature(f, virtqueue.FeatureNetGuestTSO4),
		virtqueue.HasFeature(f, virtqueue.FeatureNetGuestTSO6))
	// Without TSO every guest frame carries one segment: windows stay
	// within what the TX ring holds (tcp/ring_budget.go).
	ring := 0
	if l.stream == nil && !virtqueue.HasFeature(f, virtqueue.FeatureNetHostTSO4) && !virtqueue.HasFeature(f, virtqueue.FeatureNetHostTSO6) {
		ring = int(l.qp.TX.Size())
	}
	l.tcp.SetTXRing(ring)
	l.mtu = l.s.MTU()
	l.tcp.SetMTU(l.mtu)
}

// tcpDeadline is the TCP table's next timer, zero for none.
func (l *loop) tcpDeadline() time.Time { return l.tcp.NextTimer() }
