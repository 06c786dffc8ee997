package header

import (
	"encoding/binary"
	"testing"
)

func TestCapturedICMPEcho(t *testing.T) {
	t.Run("v4", func(t *testing.T) {
		reqIP, err := ParseIPv4(mustHex(t, capICMPv4EchoRequest))
		if err != nil || reqIP.Protocol() != IPProtocolICMPv4 {
			t.Fatal(err)
		}
		repIP, _ := ParseIPv4(mustHex(t, capICMPv4EchoReply))
		req, err := ParseICMPv4(reqIP.Payload())
		if err != nil {
			t.Fatal(err)
		}
		rep, _ := ParseICMPv4(repIP.Payload())
		if !req.IsChecksumValid() || !rep.IsChecksumValid() {
			t.Fatal("captured ICMPv4 checksums do not verify")
		}
		if req.Type() != ICMPv4EchoRequest || rep.Type() != ICMPv4EchoReply || req.Code() != 0 ||
			req.Ident() != rep.Ident() || req.Sequence() != 0 || rep.Sequence() != 0 || len(req.Payload()) != 16 {
			t.Errorf("req type %d id %d seq %d, rep type %d id %d", req.Type(), req.Ident(), req.Sequence(), rep.Type(), rep.Ident())
		}
		// Turning the request into the reply incrementally gives the
		// kernel's bytes exactly.
		old := binary.BigEndian.Uint16(req[0:2])
		req[0] = byte(ICMPv4EchoReply)
		binary.BigEndian.PutUint16(req[2:4], ChecksumUpdate(req.Checksum(), old, binary.BigEndian.Uint16(req[0:2])))
		if string(req) != string(rep) {
			t.Errorf("incremental reply %x, kernel %x", []byte(req), []byte(rep))
		}
		// Rebuilding from scratch agrees too.
		b := make([]byte, len(rep))
		EncodeICMPv4Echo(b, ICMPv4EchoReply, rep.Ident(), rep.Sequence())
		copy(b[8:], rep.Payload())
		ICMPv4(b).SetChecksum()
		if string(b) != string(rep) {
			t.Errorf("rebuilt reply %x", b)
		}
		// NAT of the echo identifier keeps the checksum valid.
		rep.SetIdent(0x1234)
		if rep.Ident() != 0x1234 || !rep.IsChecksumValid() {
			t.Error("SetIdent broke the checksum")
		}
	})
	t.Run("v6", func(t *testing.T) {
		reqIP, err := ParseIPv6(mustHex(t, capICMPv6EchoRequest))
		if err != nil || reqIP.NextHeader() != IPProtocolICMPv6 {
			t.Fatal(err)
		}
		repIP, _ := ParseIPv6(mustHex(t, capICMPv6EchoReply))
		req, _ := ParseICMPv6(reqIP.Payload())
		rep, _ := ParseICMPv6(repIP.Payload())
		if !req.IsChecksumValid(reqIP.Source(), reqIP.Destination()) || !rep.IsChecksumValid(repIP.Source(), repIP.Destination()) {
			t.Fatal("captured ICMPv6 checksums do not verify")
		}
		if req.Type() != ICMPv6EchoRequest || rep.Type() != ICMPv6EchoReply || req.Ident() != rep.Ident() || len(req.Payload()) != 16 {
			t.Errorf("req type %d id %d, rep type %d id %d", req.Type(), req.Ident(), rep.Type(), rep.Ident())
		}
		b := make([]byte, len(rep))
		EncodeICMPv6Echo(b, ICMPv6EchoReply, rep.Ident(), rep.Sequence())
		copy(b[8:], rep.Payload())
		ICMPv6(b).SetChecksum(repIP.Source(), repIP.Destination())
		if string(b) != string(rep) {
			t.Errorf("rebuilt reply %x, kernel %x", b, []byte(rep))
		}
		rep.SetIdent(7)
		if !rep.IsChecksumValid(repIP.Source(), repIP.Destination()) {
			t.Error("SetIdent broke the checksum")
		}
		if EncodeICMPv6Echo(b[:7], ICMPv6EchoReply, 1, 1) != 0 || EncodeICMPv4Echo(b[:7], ICMPv4EchoReply, 1, 1) != 0 {
			t.Error("short buffer accepted")
		}
	})
}
