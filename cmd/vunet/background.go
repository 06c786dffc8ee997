package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Going to the background, passt's way: the command a management stack
// runs returns 0 once the daemon serves (socket bound or --fd taken,
// forwarded ports open, pid file written with the daemon's pid), or
// non-zero with the error on standard error if start-up failed.
//
// A Go process cannot fork without exec (the runtime's threads do not
// survive it), so the launcher re-executes its own binary with the same
// arguments in a new session, and that process does the whole start-up
// itself. The alternative, binding everything in the launcher and passing
// the descriptors on, would split start-up across two processes and need
// the data plane rebuilt around inherited sockets; here the daemon's
// start-up is the foreground start-up, line for line. The two talk over a
// pipe whose write end the daemon inherits (its number in readyFDEnv): one
// byte when serving; end of file without it means the daemon failed, and
// the launcher exits with the daemon's status. Until then the daemon
// writes to the launcher's own standard output and error, so the caller
// reads its start-up warnings and errors exactly as from a foreground
// process; at readiness it points them at /dev/null (or the log file), so
// a caller reading the launcher's output to its end is not held open by
// the daemon. Descriptors the launcher inherited without close-on-exec,
// such as QEMU's --fd 3, pass through the exec unchanged.

// readyFDEnv names the readiness pipe's descriptor in the re-executed
// daemon's environment.
const readyFDEnv = "VUNET_READY_FD"

// readyByte is what the daemon writes when it serves.
const readyByte = 'R'

// launchBackground starts the daemon and waits for its verdict; the
// return value is the launcher's exit status.
func launchBackground(p program, args []string, o *options, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "%s: start in the background: %v\n", p.name, err)
		return 1
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	defer r.Close()
	// The write end must survive the exec; nothing else forks meanwhile.
	if _, err := unix.FcntlInt(w.Fd(), unix.F_SETFD, 0); err != nil {
		w.Close()
		return fail(err)
	}
	stdin, err := os.Open(os.DevNull)
	if err != nil {
		w.Close()
		return fail(err)
	}
	defer stdin.Close()
	if o.fd == 0 {
		stdin = os.Stdin // --fd 0: the front-end's socket is standard input
	}
	outFile, errFile := fileOr(stdout, os.Stdout), fileOr(stderr, os.Stderr)
	argv := append([]string{os.Args[0]}, args...)
	env := append(os.Environ(), readyFDEnv+"="+strconv.Itoa(int(w.Fd())))
	proc, err := os.StartProcess("/proc/self/exe", argv, &os.ProcAttr{
		Env:   env,
		Files: []*os.File{stdin, outFile, errFile},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	w.Close()
	if err != nil {
		return fail(err)
	}
	var b [1]byte
	if n, _ := r.Read(b[:]); n == 1 && b[0] == readyByte {
		proc.Release()
		return 0
	}
	// No readiness: the daemon has exited or is about to (it closes the
	// pipe only by exiting); its error is already on standard error. A
	// daemon that lost the pipe some other way and lives on is not left
	// behind, serving or not, with a launcher that failed.
	exited := make(chan *os.ProcessState, 1)
	go func() {
		st, _ := proc.Wait()
		exited <- st
	}()
	select {
	case st := <-exited:
		if st == nil {
			return fail(fmt.Errorf("daemon (pid %d) lost", proc.Pid))
		}
		if code := st.ExitCode(); code > 0 {
			return code
		}
		return fail(fmt.Errorf("daemon (pid %d) ended before serving: %v", proc.Pid, st))
	case <-time.After(readyLostGrace):
		proc.Kill()
		return fail(fmt.Errorf("daemon (pid %d) closed its readiness pipe without serving; stopped", proc.Pid))
	}
}

// readyLostGrace is how long a daemon that closed the readiness pipe
// without writing to it has to exit on its own.
const readyLostGrace = 5 * time.Second

// fileOr returns w if it is an *os.File, else def: the daemon inherits
// descriptors, not writers (tests hand run a buffer, main the real files).
func fileOr(w io.Writer, def *os.File) *os.File {
	if f, ok := w.(*os.File); ok {
		return f
	}
	return def
}

// takeReadyPipe returns the readiness pipe when this process is a daemon
// re-executed by launchBackground, else nil. The variable is removed from
// the environment so nothing the daemon starts inherits it. The pipe is an
// inherited descriptor the daemon needs until it serves: whatever closes
// inherited descriptors at start-up must spare it.
func takeReadyPipe() (*os.File, error) {
	s, ok := os.LookupEnv(readyFDEnv)
	if !ok {
		return nil, nil
	}
	os.Unsetenv(readyFDEnv)
	fd, err := strconv.Atoi(s)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: not a descriptor", readyFDEnv, s)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return nil, fmt.Errorf("%s=%d: not a pipe", readyFDEnv, fd)
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "vunet-ready"), nil
}

// startup is what the serving process does once it serves: tell whoever
// waits (the launcher, systemd) and, in the background, let go of the
// launcher's standard streams.
type startup struct {
	once       sync.Once
	pipe       *os.File // the launcher's readiness pipe; nil in the foreground
	stderrTo   *os.File // the daemon's standard error after readiness; nil: /dev/null
	keepStderr bool     // -e: standard error stays the launcher's
	detachLog  func()   // moves logging off standard error
	notify     string   // NOTIFY_SOCKET
	err        error    // what went wrong telling them, for the caller to log

	// Opened by prepare, before the sandbox, which lets the daemon open
	// no file or UNIX socket when it becomes ready.
	null       *os.File      // /dev/null, in the background
	notifyConn *net.UnixConn // connected to NOTIFY_SOCKET
	closedFDs  []int         // inherited descriptors closed at start (the sandbox's line)
}

// ready is called once, when the front-end can connect; later calls do
// nothing.
func (s *startup) ready() {
	s.once.Do(func() {
		var errs []error
		if s.notifyConn != nil {
			errs = append(errs, sdNotifyConn(s.notifyConn, s.notify, "READY=1\nMAINPID="+strconv.Itoa(os.Getpid())))
		} else if s.notify != "" {
			errs = append(errs, sdNotify(s.notify, "READY=1\nMAINPID="+strconv.Itoa(os.Getpid())))
		}
		if s.pipe != nil {
			if s.detachLog != nil {
				s.detachLog()
			}
			errs = append(errs, s.releaseStdio())
			_, err := s.pipe.Write([]byte{readyByte})
			errs = append(errs, err, s.pipe.Close())
		}
		s.err = errors.Join(errs...)
	})
}

// releaseStdio points standard input and output at /dev/null and standard
// error at the log file or /dev/null (unless -e): the launcher's caller
// sees end of file once the launcher exits. A Go panic still lands in the
// log file when there is one.
func (s *startup) releaseStdio() error {
	null := s.null
	if null == nil {
		var err error
		if null, err = os.OpenFile(os.DevNull, os.O_RDWR, 0); err != nil {
			return err
		}
	}
	defer null.Close()
	errTo := null
	if s.stderrTo != nil {
		errTo = s.stderrTo
	}
	var errs []error
	for fd, to := range map[int]*os.File{0: null, 1: null, 2: errTo} {
		if fd == 2 && s.keepStderr {
			continue
		}
		if int(to.Fd()) != fd {
			errs = append(errs, unix.Dup2(int(to.Fd()), fd))
		}
	}
	return errors.Join(errs...)
}
