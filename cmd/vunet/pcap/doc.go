// Package pcap writes guest-side Ethernet frames, both directions, to a
// pcap file (nanosecond timestamps, LINKTYPE_ETHERNET) that tcpdump,
// tshark and Wireshark read, like passt's --pcap.
//
// Capturing must not slow the data path down or make it allocate: each
// queue pair's event loop copies a frame into its own preallocated ring
// (single producer, single consumer, atomics only, no locks, no channels)
// and a background goroutine drains the rings into the file. A frame that
// does not fit in a full ring is dropped and counted, never waited for.
//
// pcap imports nothing of vunet's; the data plane reaches it through a
// small interface of its own (see Writer.Frame).
package pcap
