package tcpstack

// newServices builds the link services one loop uses. Each loop gets its own
// instances so services may keep scratch state without locking.
func (s *Stack) newServices() [NumServices]linkService {
	var svc [NumServices]linkService
	svc[SvcARP] = &arpResponder{ourMAC: s.cfg.Addr.OurMAC}
	return svc
}
