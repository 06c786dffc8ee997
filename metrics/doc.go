// Package metrics exports vunet's counters to Prometheus.
//
// The data path never touches Prometheus types: it updates plain atomic
// counters (virtqueue.Stats, stats.Queue, vhostuser.Stats) and the
// collectors here read them at scrape time, so a packet costs no label
// lookup and no lock. Every registry is vunet's own (no global default
// registry), with the Go runtime and process collectors beside ours
// (process_network_* left out: it counts the whole network namespace).
//
// Conventions, kept by tests:
//   - Every family is declared once, in families.go, with its type, help and
//     labels; Describe sends them all, and README's metrics table is
//     compared with the exposition (name, type, labels, help) both ways.
//   - One vocabulary per label: direction is to_guest or from_guest
//     everywhere; no label name or direction inside a metric name.
//   - Only combinations that can happen: a queue's series once its pair has
//     run (queue 0 always), a reason's once it has counted something.
//   - promtool check metrics finds nothing in a scrape.
//
// Adding a counter the data path keeps (flow-table occupancy per protocol,
// connect failures by reason, forward bind failures, DNS forwards, …) is
// one line in families.go (labels from the vocabulary above; a future
// protocol label says tcp, udp or icmp), one line in the collect function
// of its source, and one README row: the README test fails until all three
// agree.
//
// metrics reads the stats types of vhostuser, tcpstack and virtqueue; none of
// those may import metrics.
package metrics
