package vhostuser

import (
	"sync/atomic"

	"vunet/virtqueue"
)

// ErrorReason classifies control-plane errors for Stats.
type ErrorReason uint8

// Error reasons. The set is fixed so metrics can export one series each.
const (
	ErrReasonMalformed   ErrorReason = iota // framing, size or fd count wrong
	ErrReasonInvalid                        // well-formed but invalid: bad index, ring size, address, feature bits
	ErrReasonUnsupported                    // request the device does not implement
	ErrReasonMemory                         // mapping or memory-table failure
	ErrReasonDataPlane                      // queue construction or StartPair failure, a stop with used elements unpublished
	ErrReasonIO                             // socket read/write failure
	ErrReasonRejected                       // extra concurrent front-end turned away
	ErrReasonMemoryLimit                    // memory region refused: the total would pass DeviceConfig.MaxMemory
	ErrReasonStopTimeout                    // a queue pair did not stop within DeviceConfig.StopTimeout and was abandoned
	ErrReasonTimeout                        // connection closed: no first message, or a message not completed, in time
	NumErrorReasons
)

var errorReasonNames = [NumErrorReasons]string{
	"malformed", "invalid", "unsupported", "memory", "data_plane", "io", "rejected",
	"memory_limit", "stop_timeout", "timeout",
}

// String returns the reason's metric label.
func (r ErrorReason) String() string {
	if r < NumErrorReasons {
		return errorReasonNames[r]
	}
	return "unknown"
}

// Stats holds control-plane counters. All fields are atomics, written by the
// control goroutine and read at any time (metrics scrapes). A Stats may be
// shared by consecutive sessions; counters accumulate.
type Stats struct {
	// Messages counts requests by code; unknown codes count under ReqNone.
	Messages [NumRequests]atomic.Uint64
	// Errors counts errors by reason.
	Errors [NumErrorReasons]atomic.Uint64
	// Connected is 1 while a front-end session is active.
	Connected atomic.Int64
	// Sessions counts front-end sessions started.
	Sessions atomic.Uint64
	// GuestMemory is the size in bytes of the guest memory mapped for the
	// current session (distinct regions; 0 when disconnected).
	GuestMemory atomic.Uint64
	// Features and ProtocolFeatures are the values last acknowledged by the
	// front-end in the current session (0 when disconnected).
	Features         atomic.Uint64
	ProtocolFeatures atomic.Uint64
	// Rings are the per-ring data-path counters, indexed by vring index.
	// The device owns them (not the queues) so they survive queue rebuilds
	// and reconnects.
	Rings [MaxRings]virtqueue.Stats
}

// MessageCount returns the number of requests seen with code r.
func (s *Stats) MessageCount(r Request) uint64 {
	if r >= NumRequests {
		r = ReqNone
	}
	return s.Messages[r].Load()
}

// ErrorCount returns the number of errors counted for reason r.
func (s *Stats) ErrorCount(r ErrorReason) uint64 {
	if r >= NumErrorReasons {
		return 0
	}
	return s.Errors[r].Load()
}

func (s *Stats) countMessage(r Request) {
	if s == nil {
		return
	}
	if r >= NumRequests {
		r = ReqNone
	}
	s.Messages[r].Add(1)
}

func (s *Stats) countError(r ErrorReason) {
	if s == nil || r >= NumErrorReasons {
		return
	}
	s.Errors[r].Add(1)
}
