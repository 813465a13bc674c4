// Command echo is the demo backend: it answers every HTTP request on :80 with the name of its pod
// (HOSTNAME, which the kubelet sets to the pod name) and echoes UDP datagrams on :80 prefixed with
// that name, so tests can tell which replica served them.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// listenAddr is both the TCP and the UDP address; the seed's Service targets port 80.
const listenAddr = ":80"

// reply is the HTTP body and the UDP answer prefix: the pod name and a newline.
func reply(podName string) string { return podName + "\n" }

func main() {
	podName := os.Getenv("HOSTNAME")
	if podName == "" {
		podName, _ = os.Hostname()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, reply(podName))
	})
	srv := &http.Server{Addr: listenAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	udp, err := net.ListenPacket("udp", listenAddr)
	if err != nil {
		log.Fatalf("listen udp %s: %v", listenAddr, err)
	}
	go serveUDP(udp, podName)

	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = udp.Close()
	}()
	log.Printf("echo %s listening on tcp and udp %s", podName, listenAddr)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("serve http %s: %v", listenAddr, err)
	}
}

// serveUDP answers each datagram with "<pod name>\n<payload>" until the socket is closed.
func serveUDP(conn net.PacketConn, podName string) {
	buf := make([]byte, 64*1024)
	for {
		n, addr, err := conn.ReadFrom(buf)
		if err != nil {
			return
		}
		out := append([]byte(reply(podName)), buf[:n]...)
		if _, err := conn.WriteTo(out, addr); err != nil {
			log.Printf("udp reply to %s: %v", addr, err)
		}
	}
}
