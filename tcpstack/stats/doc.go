// Package stats is the data path's counters and how often it may log: the
// per-queue-pair counters (Queue, with its per-direction Dir, protocol
// Proto and TCP counters) that every part of the data path increments and
// package metrics exports, the names they are exported by (String methods
// give stable metric label values), and the one log rate limiter (Limiter).
//
// Every counter is an atomic: one event loop writes a pair's counters while
// metrics reads them at scrape time. The package imports only
// tcpstack/addrpolicy (for the policy's reasons) of vunet's.
package stats
