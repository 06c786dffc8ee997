package linksvc

import (
	"fmt"
	"strings"

	"vunet/tcpstack/header"
)

// The guest's names (passt's --hostname and --fqdn): DHCP option 12 (host
// name) and 81 (client FQDN, RFC 4702), DHCPv6 option 39 (client FQDN, RFC
// 4704). We do no DNS updates, which the FQDN options' flags say.

const (
	dhcpv4OptHostname   = 12
	dhcpv4OptClientFQDN = 81
	dhcpv6OptClientFQDN = 39

	// fqdnFlagE: the name is in DNS wire encoding (RFC 4702 2.1).
	fqdnFlagE = 0x04
	// fqdnFlagN: the server performs no DNS updates (RFC 4702 2.1, RFC
	// 4704 4.1).
	fqdnFlagN4 = 0x08
	fqdnFlagN6 = 0x04
	// fqdnRCode: RFC 4702 2.2: servers set both deprecated RCODE fields
	// to 255.
	fqdnRCode = 0xff
)

// validateNames checks that the names fit their options.
func (c *AddrConfig) validateNames() error {
	if len(c.Hostname) > 255 {
		return fmt.Errorf("hostname of %d bytes: longer than a DHCP option (255)", len(c.Hostname))
	}
	if strings.ContainsRune(c.Hostname, 0) {
		return fmt.Errorf("hostname %q: contains NUL", c.Hostname)
	}
	if c.FQDN != "" {
		var b [header.MaxDomainNameLength]byte
		n := header.EncodeDomainName(b[:], c.FQDN)
		if n == 0 || n > 255-3 {
			return fmt.Errorf("fqdn %q: not a valid domain name of at most 252 encoded bytes", c.FQDN)
		}
	}
	return nil
}

// addNameOptions adds options 12 and 81 when the names are configured.
func addNameOptions(w *header.DHCPv4Builder, cfg *AddrConfig) {
	if cfg.Hostname != "" {
		w.AddOptionString(dhcpv4OptHostname, cfg.Hostname)
	}
	if cfg.FQDN != "" {
		var b [3 + header.MaxDomainNameLength]byte
		b[0], b[1], b[2] = fqdnFlagE|fqdnFlagN4, fqdnRCode, fqdnRCode
		if n := header.EncodeDomainName(b[3:], cfg.FQDN); n > 0 && n <= 255-3 {
			w.AddOption(dhcpv4OptClientFQDN, b[:3+n])
		}
	}
}

// addFQDNv6 adds option 39 when the FQDN is configured.
func addFQDNv6(w *header.DHCPv6Builder, cfg *AddrConfig) {
	if cfg.FQDN == "" {
		return
	}
	var b [1 + header.MaxDomainNameLength]byte
	b[0] = fqdnFlagN6
	if n := header.EncodeDomainName(b[1:], cfg.FQDN); n > 0 {
		w.AddOption(dhcpv6OptClientFQDN, b[:1+n])
	}
}
