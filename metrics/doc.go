// Package metrics exports vunet's counters to Prometheus.
//
// The data path never touches Prometheus types: it updates plain atomic
// counters (virtqueue.Stats, tcpstack.QueueStats, vhostuser.Stats) and the
// collectors here read them at scrape time, so a packet costs no label
// lookup and no lock. Every registry is vunet's own (no global default
// registry), with build, Go runtime and process collectors beside ours.
//
// metrics reads the stats types of vhostuser, tcpstack and virtqueue; none of
// those may import metrics.
package metrics
