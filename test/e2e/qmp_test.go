package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeQEMU answers QMP like QEMU does, with events interleaved before each
// reply, so the client's demultiplexing is tested without a VM.
func fakeQEMU(t *testing.T, handle func(cmd map[string]any, w replyWriter)) string {
	// Like QEMU, echo each command's id in its reply.
	t.Helper()
	dir, err := os.MkdirTemp("", "qmp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "qmp.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		w := json.NewEncoder(c)
		_ = w.Encode(map[string]any{"QMP": map[string]any{"version": map[string]any{}, "capabilities": []string{"oob"}}})
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			var cmd map[string]any
			if json.Unmarshal(sc.Bytes(), &cmd) != nil {
				return
			}
			handle(cmd, &idEncoder{w: w, id: cmd["id"]})
		}
	}()
	return path
}

func TestQMPClient(t *testing.T) {
	var held any // the "hang" command's id, answered late
	path := fakeQEMU(t, func(cmd map[string]any, w replyWriter) {
		_ = w.Encode(map[string]any{"event": "NIC_RX_FILTER_CHANGED", "data": map[string]any{"name": "net0"}})
		switch cmd["execute"] {
		case "qmp_capabilities":
			_ = w.Encode(map[string]any{"return": map[string]any{}})
		case "query-rx-filter":
			args, _ := cmd["arguments"].(map[string]any)
			_ = w.Encode(map[string]any{"return": []any{map[string]any{"name": args["name"], "main-mac": "52:54:00:12:34:56"}}})
		case "hang":
			held = cmd["id"] // answered only after the next command arrives
		case "late":
			// The reply to the timed-out command comes first and must be ignored.
			_ = w.EncodeRaw(map[string]any{"return": "stale", "id": held})
			_ = w.Encode(map[string]any{"return": "late"})
		default:
			_ = w.Encode(map[string]any{"error": map[string]any{"class": "CommandNotFound", "desc": "The command " + cmd["execute"].(string) + " has not been found"}})
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q, err := DialQMP(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()

	rf, err := q.QueryRxFilter(ctx, "net0")
	if err != nil || rf.Name != "net0" || rf.MainMAC != "52:54:00:12:34:56" {
		t.Fatalf("query-rx-filter = %+v, %v", rf, err)
	}
	var qe *QMPError
	if _, err := q.Run(ctx, "nope", nil); !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
		t.Fatalf("unknown command: %v, want a CommandNotFound QMPError", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = q.Run(short, "hang", nil)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unanswered command: %v, want deadline exceeded", err)
	}
	if got, err := q.Run(ctx, "late", nil); err != nil || strings.TrimSpace(string(got)) != `"late"` {
		t.Fatalf("command after a timed-out one: %s, %v", got, err)
	}
	if ev, err := q.WaitEvent(ctx, "NIC_RX_FILTER_CHANGED"); err != nil || ev.Data["name"] != "net0" {
		t.Fatalf("event: %+v, %v", ev, err)
	}
	if n := len(q.Events()); n < 4 {
		t.Errorf("%d events recorded, want one per command", n)
	}
}

func TestDialQMPGivesUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := DialQMP(ctx, filepath.Join(t.TempDir(), "absent.sock")); err == nil {
		t.Fatal("dialled a socket that does not exist")
	}
}

type replyWriter interface {
	Encode(v map[string]any) error
	EncodeRaw(v map[string]any) error
}

// idEncoder adds the command's id to replies (not to events).
type idEncoder struct {
	w  *json.Encoder
	id any
}

func (e *idEncoder) Encode(v map[string]any) error {
	if _, isEvent := v["event"]; !isEvent {
		v["id"] = e.id
	}
	return e.w.Encode(v)
}

func (e *idEncoder) EncodeRaw(v map[string]any) error { return e.w.Encode(v) }
