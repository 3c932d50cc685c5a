/* fatbin.S — the bytes of one kernel module (a fatbin built by nvcc for sm_90a) as a hidden symbol,
 * so the library carries its kernels with no file to find at run time. The Makefile assembles it
 * once per kernels/NAME.cu with MT_FATBIN_PATH and MT_FATBIN_SYM (mt_fatbin_NAME) defined.
 * cuModuleLoadData reads the fatbin header, so no size symbol is needed. */
	.section .rodata
	.balign 64
	.globl MT_FATBIN_SYM
	.hidden MT_FATBIN_SYM
	.type MT_FATBIN_SYM, @object
MT_FATBIN_SYM:
	.incbin MT_FATBIN_PATH
	.byte 0
	.section .note.GNU-stack,"",@progbits
