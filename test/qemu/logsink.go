package qemu

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// LogLine is one line of a daemon's log. vunet runs with --log-format json,
// so Msg, Level and Attrs are filled; other lines keep only Raw.
type LogLine struct {
	Raw   string
	Level string
	Msg   string
	Attrs map[string]any
}

// Attr returns attribute k formatted with %v ("" when absent).
func (l LogLine) Attr(k string) string {
	v, ok := l.Attrs[k]
	if !ok {
		return ""
	}
	return fmt.Sprint(v)
}

// LogSink collects a process's log lines and lets tests wait for one.
type LogSink struct {
	mu      sync.Mutex
	lines   []LogLine
	changed chan struct{} // closed and replaced on every new line
	closed  bool
}

// NewLogSink returns an empty sink; feed it with Consume.
func NewLogSink() *LogSink { return &LogSink{changed: make(chan struct{})} }

// maxLogLine bounds one log line: a runaway line must not eat the test's memory.
const maxLogLine = 1 << 20

// Consume reads r line by line until EOF, copying each line to tee (if
// not nil). Wait reports an error once Consume has returned.
func (s *LogSink) Consume(r io.Reader, tee io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLogLine)
	for sc.Scan() {
		raw := sc.Text()
		if tee != nil {
			fmt.Fprintln(tee, raw)
		}
		s.add(parseLogLine(raw))
	}
	s.mu.Lock()
	s.closed = true
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

func parseLogLine(raw string) LogLine {
	l := LogLine{Raw: raw}
	if !strings.HasPrefix(raw, "{") {
		return l
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return l
	}
	l.Level, _ = m["level"].(string)
	l.Msg, _ = m["msg"].(string)
	delete(m, "level")
	delete(m, "msg")
	delete(m, "time")
	l.Attrs = m
	return l
}

func (s *LogSink) add(l LogLine) {
	s.mu.Lock()
	s.lines = append(s.lines, l)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// Lines returns a copy of every line so far.
func (s *LogSink) Lines() []LogLine {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]LogLine(nil), s.lines...)
}

// Match returns the lines for which match holds.
func (s *LogSink) Match(match func(LogLine) bool) []LogLine {
	var out []LogLine
	for _, l := range s.Lines() {
		if match(l) {
			out = append(out, l)
		}
	}
	return out
}

// Wait returns the first line (from the start of the log) matching match,
// waiting at most timeout for it to appear; what names it in the error.
func (s *LogSink) Wait(timeout time.Duration, what string, match func(LogLine) bool) (LogLine, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	seen := 0
	for {
		s.mu.Lock()
		lines, changed, closed := s.lines[seen:], s.changed, s.closed
		s.mu.Unlock()
		for _, l := range lines {
			if match(l) {
				return l, nil
			}
		}
		seen += len(lines)
		if closed {
			return LogLine{}, fmt.Errorf("log ended without %s", what)
		}
		select {
		case <-changed:
		case <-deadline.C:
			return LogLine{}, fmt.Errorf("no %s in the log after %v", what, timeout)
		}
	}
}

// Tail renders the last n lines for failure messages.
func (s *LogSink) Tail(n int) string {
	lines := s.Lines()
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l.Raw)
		b.WriteByte('\n')
	}
	return b.String()
}

// MsgIs matches lines whose message is exactly msg.
func MsgIs(msg string) func(LogLine) bool {
	return func(l LogLine) bool { return l.Msg == msg }
}

// RawContains matches lines containing s anywhere (for non-JSON back-ends).
func RawContains(s string) func(LogLine) bool {
	return func(l LogLine) bool { return strings.Contains(l.Raw, s) }
}
