//go:build !cgo || purego

package main

// callC does nothing: the binary is pure Go (static by default, or linked
// to the C library by the system's linker with -linkmode=external).
func callC() {}
