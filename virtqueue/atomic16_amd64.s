#include "textflag.h"

// func load16(p *uint16) uint16
// x86 loads are acquire loads.
TEXT ·load16(SB), NOSPLIT, $0-10
	MOVQ p+0(FP), AX
	MOVW (AX), BX
	MOVW BX, ret+8(FP)
	RET

// func store16(p *uint16, v uint16)
// XCHG with memory is locked: a full barrier, so later loads wait for it.
TEXT ·store16(SB), NOSPLIT, $0-10
	MOVQ p+0(FP), BX
	MOVW v+8(FP), AX
	XCHGW AX, 0(BX)
	RET
