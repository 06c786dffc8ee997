package qemu

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// replyGate sits between go-qemu's SocketMonitor and QEMU's QMP socket
// (see QMP for why). It forwards the monitor's commands unchanged and
// QEMU's output line by line; after a reply to one of our commands (its id
// carries qmpIDPrefix) it forwards nothing more until consumed is called,
// so the monitor's reader has no new data to scan over the reply.
type replyGate struct {
	addr     string // abstract UNIX socket the monitor dials
	ln       net.Listener
	upstream net.Conn
	ack      chan struct{} // one token per consumed reply
	done     chan struct{}
	once     sync.Once
	mu       sync.Mutex
	client   net.Conn
}

// qmpIDPrefix starts the id of every command QMP.Run sends.
const qmpIDPrefix = "vunet-e2e-"

// gateHold bounds how long a reply holds the stream back: Run copies it
// right away, so only a bug (a reply nobody waits for) waits this long.
const gateHold = 10 * time.Second

func newReplyGate(upstream net.Conn) (*replyGate, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	// Abstract address: nothing to clean up on disk, and private to this
	// network namespace.
	addr := "@vunet-e2e-qmp-" + hex.EncodeToString(rnd[:])
	ln, err := net.Listen("unix", addr)
	if err != nil {
		return nil, fmt.Errorf("QMP gate listen: %w", err)
	}
	g := &replyGate{addr: addr, ln: ln, upstream: upstream, ack: make(chan struct{}, 1), done: make(chan struct{})}
	go g.serve()
	return g, nil
}

func (g *replyGate) serve() {
	c, err := g.ln.Accept()
	g.ln.Close() // one monitor per gate
	if err != nil {
		g.close()
		return
	}
	g.mu.Lock()
	g.client = c
	g.mu.Unlock()
	select {
	case <-g.done: // closed while accepting
		c.Close()
		return
	default:
	}
	go func() {
		_, _ = io.Copy(g.upstream, c)
		g.close()
	}()
	r := bufio.NewReaderSize(g.upstream, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			if _, werr := c.Write(line); werr != nil {
				break
			}
			if bytes.Contains(line, []byte(`"id": "`+qmpIDPrefix)) || bytes.Contains(line, []byte(`"id":"`+qmpIDPrefix)) {
				select {
				case <-g.ack:
				case <-g.done:
					return
				case <-time.After(gateHold):
				}
			}
		}
		if err != nil {
			break
		}
	}
	g.close()
}

// consumed lets the stream go on after a reply was copied.
func (g *replyGate) consumed() {
	select {
	case g.ack <- struct{}{}:
	default:
	}
}

func (g *replyGate) close() {
	g.once.Do(func() {
		close(g.done)
		g.ln.Close()
		g.upstream.Close()
		g.mu.Lock()
		if g.client != nil {
			g.client.Close()
		}
		g.mu.Unlock()
	})
}
