package isolation

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
)

// defaultUser is whom a daemon started as root runs as (passt's default).
const defaultUser = "nobody"

// nobodyID is the conventional nobody/nogroup ID, used when the user
// database has no "nobody".
const nobodyID = 65534

// identity is the user and group the daemon serves as.
type identity struct {
	uid, gid int
	name     string // as given or looked up, for the log
}

// LookupRunAs resolves passt's --runas forms: UID, UID:GID, LOGIN,
// LOGIN:GROUP. Without a group, the user's primary group is taken; a
// numeric UID unknown to the user database gets GID = UID (as passt).
func LookupRunAs(spec string) (uid, gid int, err error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	if name == "" || hasGroup && group == "" {
		return 0, 0, fmt.Errorf("--runas %q: want UID, UID:GID, LOGIN or LOGIN:GROUP", spec)
	}
	gid = -1
	if n, err := strconv.Atoi(name); err == nil && n >= 0 {
		uid = n
		if u, err := user.LookupId(name); err == nil {
			gid, _ = strconv.Atoi(u.Gid)
		}
	} else {
		u, err := user.Lookup(name)
		if err != nil {
			return 0, 0, fmt.Errorf("--runas %q: %w", spec, err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
	}
	if hasGroup {
		if n, err := strconv.Atoi(group); err == nil && n >= 0 {
			gid = n
		} else {
			g, err := user.LookupGroup(group)
			if err != nil {
				return 0, 0, fmt.Errorf("--runas %q: %w", spec, err)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
	}
	if gid < 0 {
		gid = uid
	}
	return uid, gid, nil
}

// targetIdentity is the identity to switch to: --runas if given;
// otherwise nobody when started as root, and the current user when not
// (an unprivileged daemon has nobody else to become), nor when root is
// only a user namespace's (a container's, `unshare -r`): that root is an
// unprivileged user of the host already, and the namespace may map no
// other user (passt keeps it too).
func targetIdentity(runAs string) (identity, error) {
	if runAs != "" {
		uid, gid, err := LookupRunAs(runAs)
		if err != nil {
			return identity{}, err
		}
		return identity{uid: uid, gid: gid, name: runAs}, nil
	}
	if os.Geteuid() != 0 || !inInitialUserNamespace() {
		return identity{uid: os.Geteuid(), gid: os.Getegid(), name: strconv.Itoa(os.Geteuid())}, nil
	}
	if u, err := user.Lookup(defaultUser); err == nil {
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 == nil && err2 == nil {
			return identity{uid: uid, gid: gid, name: defaultUser}, nil
		}
	}
	return identity{uid: nobodyID, gid: nobodyID, name: defaultUser}, nil
}

// inInitialUserNamespace reports whether this process's user namespace
// is the host's: the only one whose uid_map maps every ID to itself. A
// map that cannot be read (no /proc) counts as the host's, the safe side
// for a root start.
func inInitialUserNamespace() bool {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return true
	}
	return isIdentityMap(string(b))
}

// isIdentityMap reports whether a uid_map maps all 2^32-1 IDs from 0 to
// themselves.
func isIdentityMap(m string) bool {
	f := strings.Fields(m)
	return len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295"
}
