// Command gofloor is the memory floor BenchmarkHAIdleCPU reports beside the lb pod's: a Go process
// built as the lb pod is (same toolchain and flags) that does nothing but answer HTTP, as the lb
// pod's health and metrics server does. What it holds (the runtime, the net/http server and the
// pages of its own binary) no Go lb pod can go below, whatever it leaves out.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8089", "where to answer /healthz")
	flag.Parse()
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	if err := http.ListenAndServe(*addr, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
