package guest

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ResultPrefix starts every machine-readable line the agent prints. Lines are
// searched for it anywhere, because kernel messages on the same console can
// precede it on the same line.
const ResultPrefix = "VUNET-RESULT "

// Names of results that are not checks: the agent reports "boot" when it
// starts and "done" after the last check, just before powering off.
const (
	ResultBoot = "boot"
	ResultDone = "done"
)

// Result is one check outcome as printed by the agent.
type Result struct {
	Name   string
	OK     bool
	Fields map[string]string // everything but name and ok, e.g. "ms", "detail", "ip"
}

// maxResultLine bounds what ParseResult accepts: the console is written by
// the guest, and a runaway line must not become a runaway allocation.
const maxResultLine = 64 << 10

// Format renders r as one line (without newline). Field values that are not
// plain tokens are Go-quoted so that spaces and '=' survive the round trip.
func (r Result) Format() string {
	var b strings.Builder
	b.WriteString(ResultPrefix)
	b.WriteString("name=")
	b.WriteString(quoteIfNeeded(r.Name))
	if r.OK {
		b.WriteString(" ok=1")
	} else {
		b.WriteString(" ok=0")
	}
	keys := make([]string, 0, len(r.Fields))
	for k := range r.Fields {
		if k == "name" || k == "ok" || !isToken(k) {
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b.WriteByte(' ')
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(quoteIfNeeded(r.Fields[k]))
	}
	return b.String()
}

// String is Format, for test logs.
func (r Result) String() string { return r.Format() }

// ErrNoResult means the line carries no result marker.
var ErrNoResult = errors.New("no result marker")

// ParseResult finds a result in one console line. It returns ErrNoResult for
// ordinary console output and another error for a damaged result line.
func ParseResult(line string) (Result, error) {
	i := strings.Index(line, ResultPrefix)
	if i < 0 {
		return Result{}, ErrNoResult
	}
	if len(line) > maxResultLine {
		return Result{}, fmt.Errorf("result line of %d bytes exceeds %d", len(line), maxResultLine)
	}
	rest := strings.TrimRight(line[i+len(ResultPrefix):], "\r\n")
	r := Result{Fields: map[string]string{}}
	seenName, seenOK := false, false
	for {
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" {
			break
		}
		eq := strings.IndexByte(rest, '=')
		if eq <= 0 {
			return Result{}, fmt.Errorf("result field %q: missing key=value", truncate(rest))
		}
		key := rest[:eq]
		if !isToken(key) {
			return Result{}, fmt.Errorf("result key %q: not a token", truncate(key))
		}
		rest = rest[eq+1:]
		var val string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return Result{}, fmt.Errorf("result field %s: bad quoting: %w", key, err)
			}
			val, err = strconv.Unquote(q)
			if err != nil {
				return Result{}, fmt.Errorf("result field %s: unquote: %w", key, err)
			}
			rest = rest[len(q):]
			if rest != "" && rest[0] != ' ' && rest[0] != '\t' {
				return Result{}, fmt.Errorf("result field %s: garbage after quoted value", key)
			}
		} else {
			end := strings.IndexAny(rest, " \t")
			if end < 0 {
				end = len(rest)
			}
			val, rest = rest[:end], rest[end:]
		}
		switch key {
		case "name":
			r.Name, seenName = val, true
		case "ok":
			switch val {
			case "1":
				r.OK = true
			case "0":
				r.OK = false
			default:
				return Result{}, fmt.Errorf("result ok=%q: want 0 or 1", truncate(val))
			}
			seenOK = true
		default:
			r.Fields[key] = val
		}
	}
	if !seenName || r.Name == "" || !seenOK {
		return Result{}, errors.New("result line lacks name= or ok=")
	}
	return r, nil
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '"' || c == '=' || c == '\\' {
			return false
		}
	}
	return true
}

func quoteIfNeeded(s string) string {
	if isToken(s) {
		return s
	}
	return strconv.Quote(s)
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
