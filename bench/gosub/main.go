// Command gosub is bench.subscribers written in Go: N watch clients that time and check every
// event they receive, speaking the same line protocol with bench.fanout and writing the same
// result file.
//
// Why it exists: the Python subscribers took about a core at 50,000 events/s, on a 2-core
// machine that also runs the apiserver and the server under test. A load generator that
// starves the servers it measures (kubectl proxy most of all: it needs two syscalls per event
// where watchproxy needs one) measures the machine, not the server. This one costs a few
// microseconds per event.
//
// Each watch gets its own HTTP/1.1 connection (HTTP/2 is turned off: the Python clients and
// client-go's watch against a proxy on plain HTTP use one connection per watch).
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const stampKey = "bench/sent-ns"

var (
	rvMark       = []byte(`"resourceVersion":"`)
	stampMark    = []byte(`"` + stampKey + `":"`)
	modifiedMark = []byte(`"type":"MODIFIED"`)
)

// stream is one client's record; its JSON names are bench.subscribers' Stream fields.
type stream struct {
	ExpectedNext int64  `json:"expected_next"`
	LastRV       int64  `json:"last_rv"`
	Count        int64  `json:"count"`
	Gaps         int64  `json:"gaps"`
	Reordered    int64  `json:"reordered"`
	BadLines     int64  `json:"bad_lines"`
	FirstNs      int64  `json:"first_ns"`
	LastNs       int64  `json:"last_ns"`
	Error        string `json:"error"`
	EndedEarly   bool   `json:"ended_early"`
}

type client struct {
	s         stream
	finalRV   int64
	expect    int64 // >0: check counts and order only (a real apiserver leaves RV gaps)
	latencies []int64
	done      chan struct{}
	doneOnce  sync.Once
}

func (c *client) finish() { c.doneOnce.Do(func() { close(c.done) }) }

func (c *client) complete() bool {
	if c.expect > 0 {
		return c.s.Count >= c.expect
	}
	return c.s.LastRV >= c.finalRV
}

// field returns the decimal number in the string value that follows mark, or -1.
func field(line, mark []byte) int64 {
	start := bytes.Index(line, mark)
	if start < 0 {
		return -1
	}
	start += len(mark)
	end := bytes.IndexByte(line[start:], '"')
	if end < 0 {
		return -1
	}
	n, err := strconv.ParseInt(string(line[start:start+end]), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// decodedAgrees checks the byte search against a full decode (done for the first line only).
func decodedAgrees(line []byte, rv, stamp int64) bool {
	var event struct {
		Type   string `json:"type"`
		Object struct {
			Metadata struct {
				ResourceVersion string            `json:"resourceVersion"`
				Annotations     map[string]string `json:"annotations"`
			} `json:"metadata"`
		} `json:"object"`
	}
	if json.Unmarshal(line, &event) != nil {
		return false
	}
	meta := event.Object.Metadata
	return event.Type == "MODIFIED" && meta.ResourceVersion == strconv.FormatInt(rv, 10) &&
		meta.Annotations[stampKey] == strconv.FormatInt(stamp, 10)
}

func (c *client) feed(line []byte, nowNs int64) {
	s := &c.s
	rv := field(line, rvMark)
	stamp := field(line, stampMark)
	if rv < 0 || stamp < 0 || !bytes.Contains(line, modifiedMark) {
		s.BadLines++
		return
	}
	if s.Count == 0 {
		s.FirstNs = nowNs
		if !decodedAgrees(line, rv, stamp) {
			s.BadLines++
		}
	}
	s.Count++
	c.latencies = append(c.latencies, (nowNs-stamp)/1000)
	switch {
	case c.expect > 0:
		if rv <= s.LastRV {
			s.Reordered++
		}
	case rv == s.ExpectedNext:
		s.ExpectedNext++
	case rv > s.ExpectedNext:
		s.Gaps += rv - s.ExpectedNext
		s.ExpectedNext = rv + 1
	default:
		s.Reordered++
	}
	if rv > s.LastRV {
		s.LastRV = rv
	}
}

// read consumes the body until the client is complete, the body ends or ctx is cancelled.
// One clock reading per Read: the lines of one read arrived together.
func (c *client) read(ctx context.Context, body io.ReadCloser) {
	defer c.finish()
	defer body.Close()
	buf := make([]byte, 64<<10)
	var rest []byte
	for {
		n, err := body.Read(buf)
		if n > 0 {
			now := time.Now().UnixNano()
			data := buf[:n]
			if len(rest) > 0 {
				data = append(rest, data...)
			}
			for {
				i := bytes.IndexByte(data, '\n')
				if i < 0 {
					break
				}
				c.feed(data[:i], now)
				data = data[i+1:]
			}
			rest = append(rest[:0:0], data...)
			c.s.LastNs = now
			if c.complete() {
				return
			}
		}
		if err == io.EOF {
			c.s.EndedEarly = true
			return
		}
		if err != nil {
			if ctx.Err() == nil { // not our own cancel after the drain
				c.s.Error = fmt.Sprintf("%T: %v", err, err)
			}
			return
		}
	}
}

func emit(message map[string]any) {
	line, _ := json.Marshal(message)
	os.Stdout.Write(append(line, '\n'))
}

func cpuSeconds() float64 {
	var usage syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &usage) != nil {
		return 0
	}
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano()).Seconds()
}

func main() {
	url := flag.String("url", "", "the collection URL")
	count := flag.Int("count", 0, "watch clients")
	rv := flag.Int64("rv", 0, "resourceVersion to watch from")
	expect := flag.Int64("expect", 0, "events each client must receive")
	out := flag.String("out", "", "result file")
	token := flag.String("token", "", "bearer token")
	caFile := flag.String("ca", "", "CA bundle (https)")
	connectTimeout := flag.Float64("connect-timeout", 60, "seconds for all watches to open")
	byCount := flag.Bool("by-count", false, "check counts and order, not consecutive RVs")
	flag.Parse()
	if *url == "" || *count < 1 || *out == "" {
		emit(map[string]any{"error": "gosub: --url, --count and --out are required"})
		os.Exit(2)
	}

	tlsConfig := &tls.Config{}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			emit(map[string]any{"error": "gosub: " + err.Error()})
			os.Exit(2)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tlsConfig.RootCAs = pool
	}
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSClientConfig:     tlsConfig,
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1
		DisableKeepAlives:   true,                                                   // a connection per watch
		DisableCompression:  true,
		MaxIdleConnsPerHost: -1,
	}
	httpClient := &http.Client{Transport: transport}
	target := fmt.Sprintf("%s?watch=true&resourceVersion=%d", *url, *rv)

	var expectCount int64
	if *byCount {
		expectCount = *expect
	}
	clients := make([]*client, *count)
	for i := range clients {
		clients[i] = &client{
			s:       stream{ExpectedNext: *rv + 1, LastRV: *rv},
			finalRV: *rv + *expect,
			expect:  expectCount,
			done:    make(chan struct{}),
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	connectCtx, connectCancel := context.WithTimeout(ctx, time.Duration(*connectTimeout*float64(time.Second)))
	gate := make(chan struct{}, 32) // a bounded connection storm (TLS handshakes are not free)
	var opened sync.WaitGroup
	var failedMu sync.Mutex
	failed := 0
	var readers sync.WaitGroup
	for _, c := range clients {
		opened.Add(1)
		go func(c *client) {
			defer opened.Done()
			gate <- struct{}{}
			defer func() { <-gate }()
			request, _ := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
			if *token != "" {
				request.Header.Set("Authorization", "Bearer "+*token)
			}
			type answer struct {
				response *http.Response
				err      error
			}
			answered := make(chan answer, 1)
			go func() {
				response, err := httpClient.Do(request)
				answered <- answer{response, err}
			}()
			var a answer
			select {
			case a = <-answered:
			case <-connectCtx.Done():
				a = answer{err: connectCtx.Err()}
			}
			fail := func(message string) {
				c.s.Error = message
				c.finish()
				failedMu.Lock()
				failed++
				failedMu.Unlock()
			}
			if a.err != nil {
				fail("connect: " + a.err.Error())
				return
			}
			if a.response.StatusCode != http.StatusOK {
				text, _ := io.ReadAll(io.LimitReader(a.response.Body, 200))
				a.response.Body.Close()
				fail(fmt.Sprintf("status %d: %s", a.response.StatusCode, text))
				return
			}
			readers.Add(1)
			go func() {
				defer readers.Done()
				c.read(ctx, a.response.Body)
			}()
		}(c)
	}
	opened.Wait()
	timedOut := connectCtx.Err() == context.DeadlineExceeded
	connectCancel()
	if timedOut {
		emit(map[string]any{"ready": 0, "failed": *count, "error": "connect timeout"})
		return
	}
	emit(map[string]any{"ready": *count - failed, "failed": failed})
	cpuReady := cpuSeconds()

	drain := 30 * time.Second
	drained := false
	commands := bufio.NewScanner(os.Stdin)
	for commands.Scan() {
		words := strings.Fields(commands.Text())
		if len(words) == 0 {
			continue
		}
		if words[0] == "quit" {
			break
		}
		if words[0] == "drain" && len(words) > 1 {
			if seconds, err := strconv.ParseFloat(words[1], 64); err == nil {
				drain = time.Duration(seconds * float64(time.Second))
			}
			drained = true
			break
		}
	}
	if drained {
		deadline := time.After(drain)
	wait:
		for _, c := range clients {
			select {
			case <-c.done:
			case <-deadline:
				break wait
			}
		}
	}
	cpuUsed := cpuSeconds() - cpuReady // reading only, not the report below
	cancel()                           // ends every body read still going
	readers.Wait()

	result := struct {
		Streams     []stream `json:"streams"`
		LatenciesUs []int64  `json:"latencies_us"`
	}{Streams: make([]stream, 0, len(clients)), LatenciesUs: []int64{}}
	for _, c := range clients {
		if *byCount && c.s.Count < *expect {
			c.s.Gaps = *expect - c.s.Count
		}
		result.Streams = append(result.Streams, c.s)
		result.LatenciesUs = append(result.LatenciesUs, c.latencies...)
	}
	file, err := os.Create(*out)
	if err == nil {
		writer := bufio.NewWriter(file)
		err = json.NewEncoder(writer).Encode(result)
		if err == nil {
			err = writer.Flush()
		}
		file.Close()
	}
	if err != nil {
		emit(map[string]any{"error": "gosub: " + err.Error()})
		os.Exit(1)
	}
	emit(map[string]any{"done": true, "cpu_s": float64(int(cpuUsed*1000)) / 1000})
}
