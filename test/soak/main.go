// Command soak runs vunet for a long time under everything a guest and a
// front-end do to it, and checks that it neither leaks nor stalls (make
// soak; root, iproute2, busybox).
//
// vunet serves the rig's front-end (test/rig: the guest is a kernel TCP/IP
// stack in a network namespace, behind a TAP bridged to vhost-user rings).
// Every minute, for -minutes minutes:
//
//   - two byte streams run, guest→host and host→guest (-rate each),
//     checked byte for byte at the receiving end, for 50 seconds; a stream
//     that moves no byte for 5 seconds is a stall;
//   - TCP connections churn (two workers, 100 a second each: open, echo 16 KiB, close) and the guest pings
//     a UDP echo peer, every datagram that comes back checked;
//   - at 15 s a burst of each flood of TestRigGuestFloods: SYNs to 2,000
//     distinct addresses and ports (half never answered), UDP to 2,000
//     ports, 500 overlapping and 1,000 never-completed fragmented
//     datagrams, a second of 5,000 ARP, NDP and DHCP requests each;
//   - from 25 s to 45 s vunet's resident memory (VmRSS), open descriptors
//     and goroutines (go_goroutines from its metrics) are sampled six
//     times; the minute's values are the medians (a garbage collection
//     cycle moves RSS by several MB);
//   - at 50 s the traffic stops (the streams must end byte-exact) and the
//     front-end reconnects (a new vhost-user session: new guest memory,
//     rings and the guest's flows reset, as when QEMU reconnects).
//
// The run fails when a transfer is not byte-exact, a stream stalls, vunet
// exits or a sample after minute 5 is more than 10% away from minute 5's
// (goroutines: 10% or one, whichever is more). The per-minute curve is
// printed as it goes and again at the end.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"vunet/tcpstack/linksvc"
	"vunet/test/load"
	rig "vunet/test/rig/lib"
)

func main() {
	minutes := flag.Int("minutes", 30, "length of the run in minutes")
	rate := flag.Int64("rate", 10<<20, "bytes a second of each byte stream")
	ref := flag.Int("ref", 5, "the minute whose sample the later ones are held to (after warm-up)")
	flag.Parse()
	code := 0
	if err := run(*minutes, *rate, *ref); err != nil {
		fmt.Fprintln(os.Stderr, "soak: FAIL:", err)
		code = 1
	}
	rig.Cleanup()
	os.Exit(code)
}

// sample is one minute's measurement and traffic.
type sample struct {
	minute     int
	at         time.Duration // since the run started, when sampled
	rss        int64         // kB, VmRSS: what the run is checked on
	anon, shm  int64         // kB, RssAnon (vunet's own) and RssShmem (guest memory it touched)
	fds        int
	goroutines int
	heap       float64 // Go heap in use, bytes (go_memstats_heap_inuse_bytes)
	toHost     int64   // bytes verified this minute
	toGuest    int64
	churned    int64
	udpSent    int64
	udpEchoed  int64
	floods     string
	note       string
}

func (s sample) String() string {
	return fmt.Sprintf("%6d %6s %9.1f %5.1f %5.1f %6d %10d %8.1f %11.1f %11.1f %7d %10s %s %s", s.minute, fmt.Sprintf("%d:%02d", int(s.at.Minutes()), int(s.at.Seconds())%60), float64(s.rss)/1024, float64(s.anon)/1024, float64(s.shm)/1024, s.fds, s.goroutines,
		s.heap/(1<<20), float64(s.toHost)/1e6, float64(s.toGuest)/1e6, s.churned, fmt.Sprintf("%d/%d", s.udpEchoed, s.udpSent), s.floods, s.note)
}

const header = "minute   time   RSS(MB)  anon shmem    fds goroutines heap(MB)  g→h MB ok  h→g MB ok   churn   udp echo floods (SYNs, UDP, fragments, link requests)"

func run(minutes int, rate int64, refMinute int) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, TAP)")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx := context.Background()
	r, err := rig.Start(ctx, rig.Options{
		// No --one-off: the front-end reconnects every minute. IPv6 too,
		// so Neighbor Solicitations are answered.
		Backend: []string{"{vunet}", "--socket", "{socket}", "--metrics", "{metrics}",
			"--address", "fd00:213::2/64", "--gateway", "fd00:213::1"},
		Log: log,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := r.Close(); err != nil && !strings.Contains(err.Error(), "needed SIGTERM") {
			fmt.Fprintln(os.Stderr, "soak: close rig:", err)
		}
	}()
	if err := load.OwnPrefixes(func(name string, args ...string) error {
		_, err := r.HostExec(ctx, name, args...)
		return err
	}); err != nil {
		return err
	}
	pid := r.BackendPID()
	fmt.Printf("soak: vunet pid %d, rig %s (log %s), %d minutes, streams %.0f MB/s each way\n",
		pid, r.Name(), r.BackendLog(), minutes, float64(rate)/1e6)
	fmt.Println(header)

	var curve []sample
	var failures []string
	began := time.Now()
	for m := 1; m <= minutes; m++ {
		s, err := minute(ctx, r, m, rate, began)
		if err != nil {
			failures = append(failures, fmt.Sprintf("minute %d: %v", m, err))
			s.note += " FAIL: " + err.Error()
		}
		curve = append(curve, s)
		fmt.Println(s)
		if r.BackendExited() {
			failures = append(failures, fmt.Sprintf("minute %d: vunet exited; log tail:\n%s", m, logTail(r.BackendLog(), 20)))
			break
		}
		if err != nil && len(failures) >= 3 {
			break
		}
	}
	failures = append(failures, flat(curve, refMinute)...)
	fmt.Println("\nsoak: the curve")
	fmt.Println(header)
	for _, s := range curve {
		fmt.Println(s)
	}
	if len(failures) > 0 {
		return errors.New(strings.Join(failures, "\n"))
	}
	fmt.Printf("soak: PASS: %d minutes, every transfer byte-exact, no stall, RSS/fds/goroutines within 10%% of minute %d\n", len(curve), refMinute)
	return nil
}

// flat holds every sample after the reference minute to within 10% of it.
func flat(curve []sample, refMinute int) []string {
	if len(curve) < refMinute {
		return nil
	}
	ref := curve[refMinute-1]
	var out []string
	within := func(v, r, slack float64) bool { return v >= r-slack && v <= r+slack }
	for _, s := range curve[refMinute:] {
		if !within(float64(s.rss), float64(ref.rss), 0.1*float64(ref.rss)) {
			out = append(out, fmt.Sprintf("minute %d: RSS %d kB, minute %d: %d kB (more than 10%% apart)", s.minute, s.rss, refMinute, ref.rss))
		}
		if !within(float64(s.fds), float64(ref.fds), 0.1*float64(ref.fds)) {
			out = append(out, fmt.Sprintf("minute %d: %d descriptors, minute %d: %d (more than 10%% apart)", s.minute, s.fds, refMinute, ref.fds))
		}
		if !within(float64(s.goroutines), float64(ref.goroutines), max(0.1*float64(ref.goroutines), 1)) {
			out = append(out, fmt.Sprintf("minute %d: %d goroutines, minute %d: %d", s.minute, s.goroutines, refMinute, ref.goroutines))
		}
	}
	return out
}

func streamEnds(r *rig.Rig) load.Ends {
	return load.Ends{
		Listen: func() (net.Listener, error) { return r.HostListen("tcp4", "127.0.0.1:0") },
		Dial: func(ctx context.Context, port int) (net.Conn, error) {
			return r.GuestDial(ctx, "tcp4", net.JoinHostPort(r.Gateway().String(), strconv.Itoa(port)))
		},
	}
}

// minute runs one minute of traffic, samples vunet and reconnects.
func minute(ctx context.Context, r *rig.Rig, m int, rate int64, began time.Time) (sample, error) {
	s := sample{minute: m}
	start := time.Now()
	at := func(d time.Duration) { time.Sleep(time.Until(start.Add(d))) }

	var streams []*load.Stream
	for _, toHost := range []bool{true, false} {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		st, err := load.StartStream(sctx, streamEnds(r), toHost, rate)
		cancel()
		if err != nil {
			for _, o := range streams {
				o.Stop(5 * time.Second)
			}
			return s, fmt.Errorf("start stream: %w", err)
		}
		streams = append(streams, st)
	}
	stall := watchStalls(streams)

	tl, err := r.HostListen("tcp4", "127.0.0.1:0")
	if err != nil {
		return s, err
	}
	ul, err := r.HostListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		tl.Close()
		return s, err
	}
	echo := load.StartEcho(tl, ul)
	defer echo.Close()
	gw := r.Gateway().String()
	tport, uport := tl.Addr().(*net.TCPAddr).Port, ul.LocalAddr().(*net.UDPAddr).Port
	churn := load.StartChurn(ctx, func(ctx context.Context) (net.Conn, error) {
		return r.GuestDial(ctx, "tcp4", net.JoinHostPort(gw, strconv.Itoa(tport)))
	}, 2, 100, 16<<10)
	gpc, err := r.GuestListenPacket("udp4", ":0")
	if err != nil {
		return s, err
	}
	defer gpc.Close()
	udp := load.StartUDPEcho(ctx, gpc, &net.UDPAddr{IP: r.Gateway().AsSlice(), Port: uport}, 200, 512)

	at(15 * time.Second)
	floods, ferr := burst(r, m)
	s.floods = floods

	// Six samples from 25 s (the burst's connections are gone) to 45 s;
	// the minute's values are their medians, so that where the Go
	// runtime's garbage collection cycle happens to be does not decide.
	pid := r.BackendPID()
	var rss, anon, shm, fds, gor, heap []float64
	var merr error
	for t := 25 * time.Second; t <= 45*time.Second; t += 4 * time.Second {
		at(t)
		rss = append(rss, float64(load.ProcStatusKB(pid, "VmRSS")))
		anon = append(anon, float64(load.ProcStatusKB(pid, "RssAnon")))
		shm = append(shm, float64(load.ProcStatusKB(pid, "RssShmem")))
		fds = append(fds, float64(load.ProcFDs(pid))) // before the scrape's own connection
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		met, err := r.Metrics(mctx)
		cancel()
		if err != nil {
			merr = err
			continue
		}
		gor = append(gor, met.Sum("go_goroutines"))
		heap = append(heap, met.Sum("go_memstats_heap_inuse_bytes"))
	}
	s.at = time.Since(began)
	s.rss, s.anon, s.shm = int64(median(rss)), int64(median(anon)), int64(median(shm))
	s.fds, s.goroutines, s.heap = int(median(fds)), int(median(gor)), median(heap)

	at(50 * time.Second)
	var errs []error
	if ferr != nil {
		errs = append(errs, ferr)
	}
	if merr != nil {
		errs = append(errs, merr)
	}
	for i, st := range streams {
		if err := st.Stop(20 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stream %s: %w", dirName(st.ToHost), err))
		}
		if i == 0 {
			s.toHost = st.Verified()
		} else {
			s.toGuest = st.Verified()
		}
	}
	if msg := stall(); msg != "" {
		errs = append(errs, errors.New(msg))
	}
	if err := churn.Stop(); err != nil {
		errs = append(errs, err)
	}
	s.churned = churn.Conns.Load()
	if err := udp.Stop(); err != nil {
		errs = append(errs, err)
	}
	s.udpSent, s.udpEchoed = udp.Sent.Load(), udp.Echoed.Load()
	if s.udpEchoed == 0 {
		errs = append(errs, errors.New("no UDP echo came back"))
	}
	if err := r.Err(); err != nil {
		errs = append(errs, err)
	}

	// A new front-end session, as QEMU reconnecting.
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = r.Reconnect(rctx)
	cancel()
	if err != nil {
		errs = append(errs, err)
	} else {
		s.note = "reconnected"
	}
	at(time.Minute)
	return s, errors.Join(errs...)
}

// median of v (the lower of the middle two); 0 for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[(len(v)-1)/2]
}

func dirName(toHost bool) string {
	if toHost {
		return "guest→host"
	}
	return "host→guest"
}

// watchStalls samples the streams every second; the function it returns
// stops the watch and describes any 5-second stretch a running stream
// moved no byte.
func watchStalls(streams []*load.Stream) func() string {
	stop := make(chan struct{})
	var mu sync.Mutex
	var found []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := make([]int64, len(streams))
		still := make([]int, len(streams))
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for sec := 1; ; sec++ {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			for i, st := range streams {
				v := st.Verified()
				if v == last[i] {
					still[i]++
					if still[i] == 5 {
						mu.Lock()
						found = append(found, fmt.Sprintf("stream %s stalled: no byte from second %d to %d", dirName(st.ToHost), sec-5, sec))
						mu.Unlock()
					}
				} else {
					still[i] = 0
				}
				last[i] = v
			}
		}
	}()
	return func() string {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(found, "; ")
	}
}

// burst sends one burst of each flood and says how many frames went.
func burst(r *rig.Rig, m int) (string, error) {
	fl, err := load.NewFlooder(r.InGuest, "eth0", linksvc.DefaultOurMAC, r.GuestAddr().Addr())
	if err != nil {
		return "", err
	}
	defer fl.Close()
	const rate = 5000
	syn, err := fl.SYNFlood(2000, rate, uint16(20000+(m%2)*5000))
	if err != nil {
		return "", err
	}
	udp, err := fl.UDPFlood(2000, rate)
	if err != nil {
		return "", err
	}
	frag, err := fl.FragFlood(500, 1000, rate, uint16(m*2000))
	if err != nil {
		return "", err
	}
	link, err := fl.LinkFlood(rate, rate, uint8(m))
	return fmt.Sprintf("%d/%d/%d/%d", syn, udp, frag, link), err
}

func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	b, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
