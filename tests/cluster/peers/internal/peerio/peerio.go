// Package peerio is the JSON in / JSON out shared by the peer harnesses: the
// Python benchmarks write a job file, start the harness once and read one JSON
// document back. Reading and decoding the job happens before any clock starts,
// so process start-up and input parsing are outside every timed region.
package peerio

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// ReadJob decodes the job from the file named by the first argument, or from
// stdin when there is none (or it is "-").
func ReadJob(into any) {
	var in io.Reader = os.Stdin
	if len(os.Args) > 1 && os.Args[1] != "-" {
		f, err := os.Open(os.Args[1])
		if err != nil {
			Fail("open job: %v", err)
		}
		defer f.Close()
		in = f
	}
	if err := json.NewDecoder(in).Decode(into); err != nil {
		Fail("decode job: %v", err)
	}
}

// Write prints the result document on stdout.
func Write(result any) {
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(result); err != nil {
		Fail("encode result: %v", err)
	}
}

// Fail reports on stderr and exits 1: the benchmark shows the message.
func Fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "peer: "+format+"\n", args...)
	os.Exit(1)
}
