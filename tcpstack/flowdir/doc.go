// Package flowdir is the directory of a guest's flows across queue pairs:
// which pair's tables hold the flow a guest frame belongs to, read by any
// pair's loop without a lock.
//
// Each queue pair's loop keeps its flows in tables of its own (no locks
// between pairs), but a guest with several queue pairs moves a socket from
// one TX queue to another (XPS re-picks the queue when the socket's thread
// runs on another vCPU). A loop whose table lacks a frame's flow asks the
// directory who holds it before it treats the frame as unknown (an RST for
// TCP, a new host socket for a datagram).
//
// The directory is one Shard per pair: a set of 64-bit flow fingerprints
// (a keyed hash of the flow's key, [Dir.Sum]) in an open-addressed array
// of atomics. Only the pair's own loop writes its shard (when its tables
// open, take over, hand off or close a flow — never per frame); every loop
// reads every shard, and only on a miss in its own tables. Writers never
// wait; a removal shifts entries back (linear probing keeps no tombstones)
// inside a sequence count that readers check, retrying the probe when a
// removal ran meanwhile (a seqlock whose data are atomics too).
//
// A fingerprint says where to ask, not what the flow is: the pair found
// checks the full key in its own table before it hands a flow over. The
// seed is random per Dir, so a guest cannot choose keys that collide.
//
// The package imports nothing of vunet's.
package flowdir
