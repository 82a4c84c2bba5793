// A Go heap of distinct records in a map, checked twice. Built three
// ways by the tests and the benchmark: with cgo (cgo.go; the binary links
// the C library dynamically and uzswap's preload reaches it), without cgo
// (Go's default static binary, which uzswap refuses), and as pure Go
// linked by the system's linker (`-tags purego -ldflags=-linkmode=external`
// with CGO_ENABLED=1: dynamic, no C call of its own), the way the refusal
// tells Go users to build.
//
// usage: gomap ENTRIES
//
// Prints "ok ENTRIES SUM" and exits 0 only if every record reads back as
// made (a page of the heap read back wrong fails a record).
package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// record is 64 bytes derived from k by xorshift.
func record(k uint64) []byte {
	r := make([]byte, 64)
	x := k*0x9E3779B97F4A7C15 + 1
	for i := range r {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		r[i] = byte(x)
	}
	return r
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gomap ENTRIES")
		os.Exit(2)
	}
	n, err := strconv.Atoi(os.Args[1])
	if err != nil || n < 1 {
		fmt.Fprintln(os.Stderr, "gomap: ENTRIES must be a positive count")
		os.Exit(2)
	}
	m := make(map[uint64][]byte)
	for k := 0; k < n; k++ {
		m[uint64(k)] = record(uint64(k))
	}
	var sum int64
	for pass := 0; pass < 2; pass++ {
		k := 0
		for i := 0; i < n; i++ {
			k = (k + 7919) % n
			got := m[uint64(k)]
			if !bytes.Equal(got, record(uint64(k))) {
				fmt.Println("record", k, "is wrong")
				os.Exit(1)
			}
			sum += int64(got[k%64])
		}
	}
	callC()
	fmt.Println("ok", n, sum)
}
