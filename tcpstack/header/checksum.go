package header

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// Checksum returns the 16-bit one's complement sum (RFC 1071) of b, added to
// initial, folded but NOT complemented. Keeping the sum uncomplemented lets
// callers chain partial sums (pseudo-header, header, payload pieces) with
// ChecksumCombine and complement once at the end.
//
// An odd trailing byte is treated as the high byte of a zero-padded word, so
// chaining is only correct when every piece but the last has even length.
func Checksum(b []byte, initial uint16) uint16 {
	// Summing big-endian 64-bit words with end-around carry gives the same
	// folded result as summing 16-bit words (one's complement addition is
	// associative across word sizes), at a quarter of the loop iterations.
	acc := uint64(initial)
	var carry uint64
	for len(b) >= 32 {
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[0:8]), 0)
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[8:16]), carry)
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[16:24]), carry)
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[24:32]), carry)
		acc += carry
		b = b[32:]
	}
	for len(b) >= 8 {
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[0:8]), 0)
		acc += carry
		b = b[8:]
	}
	if len(b) >= 4 {
		acc, carry = bits.Add64(acc, uint64(binary.BigEndian.Uint32(b[0:4])), 0)
		acc += carry
		b = b[4:]
	}
	if len(b) >= 2 {
		acc, carry = bits.Add64(acc, uint64(binary.BigEndian.Uint16(b[0:2])), 0)
		acc += carry
		b = b[2:]
	}
	if len(b) == 1 {
		acc, carry = bits.Add64(acc, uint64(b[0])<<8, 0)
		acc += carry
	}
	return fold64(acc)
}

// fold64 folds a 64-bit one's complement accumulator to 16 bits.
func fold64(acc uint64) uint16 {
	acc = (acc >> 32) + (acc & 0xffffffff)
	acc = (acc >> 32) + (acc & 0xffffffff)
	acc = (acc >> 16) + (acc & 0xffff)
	acc = (acc >> 16) + (acc & 0xffff)
	acc = (acc >> 16) + (acc & 0xffff)
	return uint16(acc)
}

// ChecksumCombine adds two uncomplemented one's complement sums.
func ChecksumCombine(a, b uint16) uint16 {
	v := uint32(a) + uint32(b)
	return uint16(v + v>>16)
}

// PseudoHeaderChecksum returns the uncomplemented sum of the IPv4 or IPv6
// pseudo-header (RFC 793 / RFC 8200 section 8.1) for an upper-layer packet
// of length bytes. src and dst must be the same family; an IPv4-mapped IPv6
// address counts as IPv6 (callers Unmap when they mean IPv4).
func PseudoHeaderChecksum(proto IPProtocol, src, dst netip.Addr, length uint32) uint16 {
	var sum uint16
	if src.Is4() {
		s, d := as4(src), as4(dst)
		sum = Checksum(s[:], 0)
		sum = Checksum(d[:], sum)
		sum = ChecksumCombine(sum, uint16(length))
	} else {
		s, d := src.As16(), dst.As16()
		sum = Checksum(s[:], 0)
		sum = Checksum(d[:], sum)
		sum = ChecksumCombine(sum, uint16(length>>16))
		sum = ChecksumCombine(sum, uint16(length))
	}
	return ChecksumCombine(sum, uint16(proto))
}

// ChecksumUpdate returns the checksum field value after one 16-bit word
// covered by it changed from old to new, without resumming the packet
// (RFC 1624 equation 3: HC' = ~(~HC + ~m + m')). checksum is the value as
// stored in the header (already complemented).
func ChecksumUpdate(checksum, old, new uint16) uint16 {
	sum := ChecksumCombine(^checksum, ^old)
	sum = ChecksumCombine(sum, new)
	return ^sum
}
