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
// (an unprivileged daemon has nobody else to become).
func targetIdentity(runAs string) (identity, error) {
	if runAs != "" {
		uid, gid, err := LookupRunAs(runAs)
		if err != nil {
			return identity{}, err
		}
		return identity{uid: uid, gid: gid, name: runAs}, nil
	}
	if os.Geteuid() != 0 {
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
