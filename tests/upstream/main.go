// Command upstream is the HTTPS server the proxy tests talk to through a VM's secret proxy. It runs
// in a container the test starts on the proxies' egress network, and appends what it receives to a
// JSON-lines record file that the test reads back with a copy from the container (never through
// the proxy, whose response masking would hide the values).
//
// Usage:
//
//	upstream -cert server.pem -key server-key.pem [-addr :443] [-record /records.jsonl]
//
// Endpoints (any host name the certificate holds):
//
//	/echo          records the request (host, SNI, method, path, query, headers, body up to
//	               64 KiB) and answers it as JSON
//	/sse?id=ID     a server-sent event stream: "data: first" at once, then, when /release?id=ID
//	               arrives (or after 30 s, or when the client leaves), "data: last released" (or
//	               "… timeout") and the end of the stream; records when each event was written
//	/release?id=ID releases the stream ID
//	/bytes?n=N     N bytes of a repeating pattern, with Content-Length; records how many went out
//
// With -probe HOST:PORT it is a client instead: it sends a CONNECT without a proxy credential to
// the proxy there and prints the status line of the answer.
//
// Every accepted TCP connection is recorded ({"kind":"conn"}) before any TLS, so a test can tell
// that nothing reached the server.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// record is one line of the record file.
type record struct {
	Kind    string              `json:"kind"` // conn, request, sse-first, sse-last, bytes
	TimeNS  int64               `json:"time_ns"`
	Remote  string              `json:"remote,omitempty"`
	Host    string              `json:"host,omitempty"`
	SNI     string              `json:"sni,omitempty"`
	Proto   string              `json:"proto,omitempty"`
	Method  string              `json:"method,omitempty"`
	Path    string              `json:"path,omitempty"`
	Query   string              `json:"query,omitempty"`
	Headers map[string][]string `json:"headers,omitempty"`
	Body    string              `json:"body,omitempty"`
	ID      string              `json:"id,omitempty"`
	Detail  string              `json:"detail,omitempty"`
	Bytes   int64               `json:"bytes,omitempty"`
}

type server struct {
	mu      sync.Mutex
	out     *os.File
	streams map[string]chan struct{}
}

func (s *server) write(r record) {
	r.TimeNS = time.Now().UnixNano()
	b, err := json.Marshal(r)
	if err != nil {
		log.Printf("encode record: %v", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.out.Write(append(b, '\n')); err != nil {
		log.Printf("write record: %v", err)
	}
}

// stream returns the release channel of stream id, creating it.
func (s *server) stream(id string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.streams[id]
	if !ok {
		c = make(chan struct{})
		s.streams[id] = c
	}
	return c
}

func (s *server) base(r *http.Request, kind string) record {
	rec := record{Kind: kind, Remote: r.RemoteAddr, Host: r.Host, Proto: r.Proto, Method: r.Method,
		Path: r.URL.Path, Query: r.URL.RawQuery, ID: r.URL.Query().Get("id")}
	if r.TLS != nil {
		rec.SNI = r.TLS.ServerName
	}
	return rec
}

func (s *server) echo(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	rec := s.base(r, "request")
	rec.Headers = r.Header
	rec.Body = string(body)
	s.write(rec)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(rec)
}

func (s *server) sse(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	release := s.stream(id)
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "no flusher", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "data: first\n\n")
	fl.Flush()
	s.write(s.base(r, "sse-first"))
	how := "released"
	select {
	case <-release:
	case <-time.After(30 * time.Second):
		how = "timeout"
	case <-r.Context().Done():
		how = "client gone"
	}
	_, _ = io.WriteString(w, "data: last "+how+"\n\n")
	fl.Flush()
	rec := s.base(r, "sse-last")
	rec.Detail = how
	s.write(rec)
}

func (s *server) release(w http.ResponseWriter, r *http.Request) {
	c := s.stream(r.URL.Query().Get("id"))
	s.mu.Lock()
	select {
	case <-c:
	default:
		close(c)
	}
	s.mu.Unlock()
	s.write(s.base(r, "release"))
	_, _ = io.WriteString(w, "released\n")
}

func (s *server) bytes(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err != nil || n < 0 {
		http.Error(w, "want n=BYTES", http.StatusBadRequest)
		return
	}
	chunk := make([]byte, 64<<10)
	for i := range chunk {
		chunk[i] = byte('a' + i%26)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	var sent int64
	for sent < n {
		k := int64(len(chunk))
		if n-sent < k {
			k = n - sent
		}
		m, err := w.Write(chunk[:k])
		sent += int64(m)
		if err != nil {
			break
		}
	}
	rec := s.base(r, "bytes")
	rec.Bytes = sent
	s.write(rec)
}

// probeProxy sends "CONNECT target" without a proxy credential to the proxy at addr and prints
// the status line of the answer. It returns the exit code: 0 when an answer came.
func probeProxy(addr, target string) int {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		fmt.Fprintf(os.Stderr, "probe: %v\n", err)
		return 1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		fmt.Fprintf(os.Stderr, "probe: %v\n", err)
		return 1
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Fprintf(os.Stderr, "probe: read: %v\n", err)
		return 1
	}
	fmt.Println(strings.TrimSpace(line))
	return 0
}

func main() {
	addr := flag.String("addr", ":443", "address to listen on")
	certFile := flag.String("cert", "", "server certificate (PEM)")
	keyFile := flag.String("key", "", "server key (PEM)")
	recordFile := flag.String("record", "/records.jsonl", "file the records are appended to")
	probe := flag.String("probe", "", "instead of serving: send a CONNECT without credential to the proxy at this host:port, print its status line and exit 0")
	probeTarget := flag.String("probe-target", "example.test:443", "the CONNECT target of -probe")
	flag.Parse()
	log.SetFlags(0)
	log.SetOutput(os.Stderr)

	if *probe != "" {
		os.Exit(probeProxy(*probe, *probeTarget))
	}
	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		log.Fatalf("upstream: %v", err)
	}
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("upstream: %v", err)
	}
	// The record file appears once the server listens: tests wait for it.
	out, err := os.OpenFile(*recordFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		log.Fatalf("upstream: %v", err)
	}
	s := &server{out: out, streams: map[string]chan struct{}{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", s.echo)
	mux.HandleFunc("/sse", s.sse)
	mux.HandleFunc("/release", s.release)
	mux.HandleFunc("/bytes", s.bytes)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}},
		ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.write(record{Kind: "conn", Remote: c.RemoteAddr().String()})
			}
		},
	}
	fmt.Fprintf(os.Stderr, "upstream listening on %s\n", l.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.ServeTLS(l, "", ""); err != nil && err != http.ErrServerClosed {
		log.Fatalf("upstream: %v", err)
	}
}
