package tcp

import "time"

// Challenge ACKs (RFC 5961): a guest segment that could be a blind attack
// on a connection (an RST in the window but not at the next byte, a SYN on
// an established connection, an ACK of data never sent) is answered with
// an ACK that tells a genuine sender where the connection is, and nothing
// else happens. Each answer is a frame on the guest's RX ring that the
// guest's own segment provoked, so they are rate-limited per connection,
// one per challengeAckInterval, as Linux limits them per socket
// (tcp_invalid_ratelimit, 500 ms; its older per-namespace
// tcp_challenge_ack_limit was a shared budget whose exhaustion told an
// off-path attacker which connection it had hit, CVE-2016-5696, so none
// is shared here).

// challengeAckInterval is the least time between two challenge ACKs of one
// connection.
const challengeAckInterval = 500 * time.Millisecond

// challengeAck queues a challenge ACK on f unless f sent one less than
// challengeAckInterval ago.
func (t *Table) challengeAck(now time.Time, f *conn) {
	if !f.challengeAt.IsZero() && now.Sub(f.challengeAt) < challengeAckInterval && !now.Before(f.challengeAt) {
		t.stats.ChallengeAcksLimited.Add(1)
		return
	}
	f.challengeAt = now
	f.flags |= flAckDue
	t.markDirty(f)
}
