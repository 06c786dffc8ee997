package tcpstack

import "time"

// newServices builds the link services one loop uses. Each loop gets its own
// instances (the ARP service records the guest's MAC); they all read the
// Stack's AddrConfig, which does not change while pairs run.
func (s *Stack) newServices() (svc [NumServices]linkService, ndp *NDPService, arp *ARPService) {
	arp = &ARPService{Config: &s.cfg.Addr}
	ndp = &NDPService{Config: &s.cfg.Addr}
	svc[SvcARP] = arp
	svc[SvcDHCP] = &DHCPService{Config: &s.cfg.Addr}
	svc[SvcDHCPv6] = &DHCPv6Service{Config: &s.cfg.Addr}
	svc[SvcNDP] = ndp
	return svc, ndp, arp
}

// raInterval is how often an unsolicited Router Advertisement refreshes the
// guest's default route (the RA's router lifetime is 9000s).
const raInterval = 10 * time.Minute

// announceLink queues what a guest that may have missed our earlier answers
// needs after a (re)start of the pair: a gratuitous ARP for the gateway, so
// a stale neighbour entry is replaced, and a Router Advertisement.
func (l *loop) announceLink() {
	cfg := &l.s.cfg.Addr
	if cfg.IPv4.Gateway.Is4() && !cfg.Disable4 {
		if n := l.arp.GratuitousARP(l.pending.next()); n > 0 {
			l.st.ServiceReplies[SvcARP].Add(1)
			l.queueReply(n)
		}
	}
	l.sendRA()
}

// sendRA queues an unsolicited Router Advertisement when the guest has an
// IPv6 prefix to learn, and schedules the next one.
func (l *loop) sendRA() {
	cfg := &l.s.cfg.Addr
	if !cfg.IPv6.Addr.IsValid() || cfg.Disable6 || cfg.NoNDP || cfg.NoRA {
		return
	}
	if n := l.ndp.RouterAdvert(l.pending.next()); n > 0 {
		l.st.ServiceReplies[SvcNDP].Add(1)
		l.st.Proto.RouterAdverts.Add(1)
		l.queueReply(n)
	}
	l.nextRA = time.Now().Add(raInterval)
}
