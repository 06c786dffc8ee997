package isolation

import "testing"

func TestLookupRunAs(t *testing.T) {
	tests := []struct {
		spec     string
		uid, gid int
		err      bool
	}{
		{"root", 0, 0, false},
		{"0", 0, 0, false},
		{"0:0", 0, 0, false},
		{"root:root", 0, 0, false},
		{"4242", 4242, 4242, false}, // unknown numeric UID: group = UID
		{"4242:7", 4242, 7, false},
		{"", 0, 0, true},
		{":0", 0, 0, true},
		{"root:", 0, 0, true},
		{"no-such-user-vunet", 0, 0, true},
		{"root:no-such-group-vunet", 0, 0, true},
	}
	for _, tt := range tests {
		uid, gid, err := LookupRunAs(tt.spec)
		if (err != nil) != tt.err || !tt.err && (uid != tt.uid || gid != tt.gid) {
			t.Errorf("%q: %d:%d %v, want %d:%d err=%v", tt.spec, uid, gid, err, tt.uid, tt.gid, tt.err)
		}
	}
}

func TestIsIdentityMap(t *testing.T) {
	for m, want := range map[string]bool{
		"         0          0 4294967295\n":                                   true,
		"         0          0          1\n":                                   false, // unshare -r
		"         0       1000          1\n         1     100000      65536\n": false, // rootless container
		"": false,
	} {
		if got := isIdentityMap(m); got != want {
			t.Errorf("%q: %v, want %v", m, got, want)
		}
	}
}
