#include "textflag.h"

// func load16(p *uint16) uint16
TEXT ·load16(SB), NOSPLIT, $0-10
	MOVD p+0(FP), R0
	LDARH (R0), R1
	MOVH R1, ret+8(FP)
	RET

// func store16(p *uint16, v uint16)
// STLR is ordered before any later LDAR (RCsc), giving store-load order.
TEXT ·store16(SB), NOSPLIT, $0-10
	MOVD p+0(FP), R0
	MOVHU v+8(FP), R1
	STLRH R1, (R0)
	RET
