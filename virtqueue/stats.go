package virtqueue

import "sync/atomic"

// Stats are a queue's counters. The caller owns them so that they survive
// queue rebuilds (memory table changes, reconnects); metrics read them at
// scrape time while the data plane updates them, hence atomics.
type Stats struct {
	Chains             atomic.Uint64 // distinct chains handed to the caller by Pop (re-Pops after Unpop not counted)
	BadChains          atomic.Uint64 // malformed chains returned to the guest with length 0
	UsedPublished      atomic.Uint64 // used elements made visible to the driver (Flush)
	Notifies           atomic.Uint64 // call eventfd signals sent by Flush
	NotifiesSuppressed atomic.Uint64 // Flushes that needed no signal (EVENT_IDX or NO_INTERRUPT)
	Kicks              atomic.Uint64 // driver kicks seen: counter reads (DrainKick) or edges of an edge-triggered poller (CountKick); coalesced
	SignalErrors       atomic.Uint64 // failed writes to the call eventfd
	ErrSignals         atomic.Uint64 // writes to the error eventfd (queue broken, memory fault)
	DirtyLogWrites     atomic.Uint64 // writes to guest memory marked in the dirty log (migration)
	DirtyLogMisses     atomic.Uint64 // of those, writes the front-end's log was too small to cover (wholly or partly)
}
