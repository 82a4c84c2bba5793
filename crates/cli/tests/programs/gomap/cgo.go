//go:build cgo && !purego

package main

// #include <stdlib.h>
import "C"

// callC makes one call into C: the binary is a cgo one.
func callC() {
	C.free(C.malloc(16))
}
