package header

// MaxDomainNameLength is the longest encoded domain name (RFC 1035 3.1).
const MaxDomainNameLength = 255

// DomainNameEncodedLen returns how many bytes name takes in RFC 1035 label
// encoding (uncompressed, with the terminating root label), or 0 when the
// name cannot be encoded: an empty label, a label over 63 bytes or a total
// over 255. A single trailing dot is accepted; "." alone is the root (1).
func DomainNameEncodedLen(name string) int {
	if len(name) > 0 && name[len(name)-1] == '.' {
		name = name[:len(name)-1]
	}
	if name == "" {
		return 1
	}
	n, label := 1, 0
	for i := 0; i <= len(name); i++ {
		if i == len(name) || name[i] == '.' {
			if label == 0 || label > 63 {
				return 0
			}
			n += 1 + label
			label = 0
			continue
		}
		label++
	}
	if n > MaxDomainNameLength {
		return 0
	}
	return n
}

// EncodeDomainName writes name in RFC 1035 label encoding (no compression)
// into b and returns the length written, or 0 when the name is invalid (see
// DomainNameEncodedLen) or b is too short. Compression is not used: DHCPv6
// and NDP forbid it, and DHCPv4 option 119 allows but does not need it.
func EncodeDomainName(b []byte, name string) int {
	n := DomainNameEncodedLen(name)
	if n == 0 || n > len(b) {
		return 0
	}
	if len(name) > 0 && name[len(name)-1] == '.' {
		name = name[:len(name)-1]
	}
	w, start := 0, 0
	for i := 0; i <= len(name); i++ {
		if name != "" && (i == len(name) || name[i] == '.') {
			b[w] = byte(i - start)
			w += 1 + copy(b[w+1:], name[start:i])
			start = i + 1
		}
	}
	b[w] = 0
	return w + 1
}
