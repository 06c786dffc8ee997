package main

import "testing"

func TestTestpmdPeer(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/opt/passt/passt --vhost-user -f -1 -s {socket}", "/opt/passt/passt --vhost-user -f -1 -s {socket} --pcap /dev/null"},
		{"passt.avx2 --vhost-user -f -s {socket}", "passt.avx2 --vhost-user -f -s {socket} --pcap /dev/null"},
		// A capture already asked for: passt fills the checksums.
		{"passt --vhost-user -f -s {socket} --pcap /tmp/x.pcap", "passt --vhost-user -f -s {socket} --pcap /tmp/x.pcap"},
		{"passt --vhost-user -f -s {socket} --pcap=/tmp/x.pcap", "passt --vhost-user -f -s {socket} --pcap=/tmp/x.pcap"},
		{"passt --vhost-user -f -s {socket} -p /tmp/x.pcap", "passt --vhost-user -f -s {socket} -p /tmp/x.pcap"},
		{"taskset -c 1 /opt/passt/passt --vhost-user -f -s {socket}", "taskset -c 1 /opt/passt/passt --vhost-user -f -s {socket} --pcap /dev/null"},
		{"passt --vhost-user -f -s {socket} -p/tmp/x.pcap", "passt --vhost-user -f -s {socket} -p/tmp/x.pcap"},
		// A wrapper's own -p is not passt's capture.
		{"numactl -p 0 /opt/passt/passt --vhost-user -f -s {socket}", "numactl -p 0 /opt/passt/passt --vhost-user -f -s {socket} --pcap /dev/null"},
		// Other back-ends run as given, passt in an option's value too.
		{"/opt/foo --socket {socket} --log-dir /var/log/passt", "/opt/foo --socket {socket} --log-dir /var/log/passt"},
		{"/opt/passthrough-vu --socket {socket}", "/opt/passthrough-vu --socket {socket}"},
		{"/usr/bin/vunet --socket {socket}", "/usr/bin/vunet --socket {socket}"},
		{"/opt/mypasstlike --socket {socket}", "/opt/mypasstlike --socket {socket}"},
	} {
		if got := testpmdPeer(tc.in); got != tc.want {
			t.Errorf("testpmdPeer(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
