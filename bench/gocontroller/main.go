// Command gocontroller is the load of bench.controller: N workers that each loop, as fast as
// the server answers, over what a controller does with its objects: GET one, merge-PATCH it,
// LIST a small page, LIST everything in pages of 2, CREATE one of its own and DELETE it again.
// The object a worker GETs and PATCHes is its own, as a controller's work queue never hands
// one key to two workers at once; with -hot-object they all take one shared object, and the
// apiserver's retries of conflicting PATCHes on it set the tail (the workload before
// 2026-12-06: its p99 at 32 workers was the 88th percentile of those PATCHes).
// Every request's latency is kept; at the end one JSON line gives the count, the errors by
// status, requests per second and p50/p99 in milliseconds. A 429 is retried as client-go's REST
// client retries it (after its Retry-After, up to 10 times), so a request counts once, with the
// time its retries took, and is an error only when the last retry still got 429.
//
// Written in Go with the standard library for the reason bench/gosub is: a Python load
// generator would need a core of its own at these rates and measure the machine instead of
// the server. One keep-alive HTTP/1.1 connection per worker, as client-go's transport keeps.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

type result struct {
	Requests int            `json:"requests"`
	Retried  int            `json:"retried_429"`
	Errors   map[string]int `json:"errors"`
	Seconds  float64        `json:"seconds"`
	PerSec   float64        `json:"per_second"`
	P50ms    float64        `json:"p50_ms"`
	P99ms    float64        `json:"p99_ms"`
	// Per verb (LIST: a GET with a query): where the tail comes from.
	Verbs map[string]verbResult `json:"verbs"`
}

type verbResult struct {
	Requests int     `json:"requests"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
}

// percentiles sorts latencies and gives their p50 and p99 in milliseconds.
func percentiles(latencies []time.Duration) (float64, float64) {
	n := len(latencies)
	if n == 0 {
		return 0, 0
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	return float64(latencies[n/2]) / 1e6, float64(latencies[n*99/100]) / 1e6
}

// sample is one request for -trace: when it started (ms into the run), how long it took, what.
type sample struct {
	StartMs float64 `json:"start_ms"`
	Ms      float64 `json:"ms"`
	Worker  int     `json:"worker"`
	What    string  `json:"what"`
}

type worker struct {
	client    *http.Client
	base      string
	token     string
	id        int
	byVerb    map[string][]time.Duration // GET, LIST, PATCH, POST, DELETE: every latency
	trace     []sample                   // with -trace: every request
	tracing   bool
	started0  time.Time
	errors    map[string]int
	retried   int // 429s answered and retried
	userAgent string
	patched   string // the configmap this worker GETs and PATCHes
	// No request starts after this: one loop holds up to ~55 requests, each retried up to 10
	// times after its Retry-After, so checking only between loops let a pushback cell run
	// for minutes past its end.
	until time.Time
}

// do sends one request unless the cell is over (then it returns nil and counts nothing).
func (w *worker) do(method, path, contentType string, body []byte) []byte {
	if time.Now().After(w.until) {
		return nil
	}
	return w.send(method, path, contentType, body)
}

// exchange sends one request as client-go's REST client does: a 429 is retried up to 10 times
// after its Retry-After. It gives the last answer's status (0: no answer, err says why) and
// body (err: the body broke off), and how many 429s it retried.
func (w *worker) exchange(method, path, contentType string, body []byte) (int, []byte, int, error) {
	req, err := http.NewRequest(method, w.base+path, bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	if w.token != "" {
		req.Header.Set("Authorization", "Bearer "+w.token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", w.userAgent)
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			req.Body = io.NopCloser(bytes.NewReader(body))
		}
		resp, err := w.client.Do(req)
		if err != nil {
			return 0, nil, attempt, err
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 429 || attempt == 10 {
			return resp.StatusCode, data, attempt, err
		}
		seconds, convErr := strconv.Atoi(resp.Header.Get("Retry-After"))
		if convErr != nil || seconds < 1 {
			seconds = 1
		}
		time.Sleep(time.Duration(seconds) * time.Second)
	}
}

// send is one request of the load: its time (retries included) and its errors count.
func (w *worker) send(method, path, contentType string, body []byte) []byte {
	started := time.Now()
	status, data, retried, err := w.exchange(method, path, contentType, body)
	w.retried += retried
	if status == 0 {
		w.errors["transport"]++
		return nil
	}
	took := time.Since(started)
	what := method
	if method == "GET" && strings.Contains(path, "?") {
		what = "LIST"
	}
	w.byVerb[what] = append(w.byVerb[what], took)
	if w.tracing {
		w.trace = append(w.trace, sample{float64(started.Sub(w.started0)) / 1e6,
			float64(took) / 1e6, w.id, what})
	}
	if err != nil {
		w.errors["body"]++
		return nil
	}
	if status >= 300 {
		w.errors[fmt.Sprint(status)]++
	}
	return data
}

// ensure creates the worker's own configmap unless it is there (from an earlier cell); it is
// set-up, not load, so neither its time nor its answer counts.
func (w *worker) ensure(ns string) {
	body := fmt.Sprintf(`{"metadata":{"name":%q},"data":{}}`, w.patched)
	status, _, _, err := w.exchange("POST", "/api/v1/namespaces/"+ns+"/configmaps",
		"application/json", []byte(body))
	if err != nil {
		panic(err)
	}
	if status != 201 && status != 409 {
		panic(fmt.Sprintf("creating %s: status %d", w.patched, status))
	}
}

func (w *worker) loop(ns string, until time.Time) {
	collection := "/api/v1/namespaces/" + ns + "/configmaps"
	mine := fmt.Sprintf("bench-controller-%d", w.id)
	patched := collection + "/" + w.patched
	for i := 0; time.Now().Before(until); i++ {
		w.do("GET", patched, "", nil)
		patch := fmt.Sprintf(`{"data":{"worker-%d":"%d"}}`, w.id, i)
		w.do("PATCH", patched, "application/merge-patch+json", []byte(patch))
		w.do("GET", collection+"?limit=5", "", nil)
		cont := ""
		for page := 0; page < 50; page++ {
			path := collection + "?limit=2"
			if cont != "" {
				path += "&continue=" + cont
			}
			var list struct {
				Metadata struct {
					Continue string `json:"continue"`
				} `json:"metadata"`
			}
			if json.Unmarshal(w.do("GET", path, "", nil), &list) != nil || list.Metadata.Continue == "" {
				break
			}
			cont = list.Metadata.Continue
		}
		created := fmt.Sprintf(`{"metadata":{"name":%q},"data":{"i":"%d"}}`, mine, i)
		if w.do("POST", collection, "application/json", []byte(created)) != nil {
			// Whatever the time: a configmap left behind would make the next cell's POST a 409.
			w.send("DELETE", collection+"/"+mine, "", nil)
		}
	}
}

func main() {
	base := flag.String("url", "", "server URL")
	tokenFile := flag.String("token-file", "", "bearer token file (none: no Authorization)")
	caFile := flag.String("ca", "", "CA bundle for https")
	ns := flag.String("namespace", "default", "namespace of the configmaps")
	workers := flag.Int("workers", 8, "concurrent workers")
	seconds := flag.Float64("seconds", 10, "how long to run")
	userAgent := flag.String("user-agent", "", "one User-Agent for every worker (default: one each)")
	hotObject := flag.Bool("hot-object", false, "every worker GETs and PATCHes the one configmap bench-shared")
	traceFile := flag.String("trace", "", "write every request (start, duration, verb) here as JSON lines")
	flag.Parse()
	token := ""
	if *tokenFile != "" {
		data, err := os.ReadFile(*tokenFile)
		if err != nil {
			panic(err)
		}
		token = string(bytes.TrimSpace(data))
	}
	transport := &http.Transport{MaxIdleConnsPerHost: *workers, ForceAttemptHTTP2: false,
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			panic(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		transport.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	client := &http.Client{Transport: transport, Timeout: 60 * time.Second}
	all := make([]*worker, *workers)
	for i := range all {
		all[i] = &worker{client: client, base: *base, token: token, id: i, errors: map[string]int{},
			byVerb: map[string][]time.Duration{}, userAgent: *userAgent,
			tracing: *traceFile != "", patched: "bench-shared"}
		if *userAgent == "" {
			all[i].userAgent = fmt.Sprintf("gocontroller/worker-%d", i)
		}
		if !*hotObject {
			all[i].patched = fmt.Sprintf("bench-worker-%d", i)
			all[i].ensure(*ns)
		}
	}
	until := time.Now().Add(time.Duration(*seconds * float64(time.Second)))
	started := time.Now()
	var wg sync.WaitGroup
	for _, w := range all {
		w.until, w.started0 = until, started
		wg.Add(1)
		go func(w *worker) { defer wg.Done(); w.loop(*ns, until) }(w)
	}
	wg.Wait()
	elapsed := time.Since(started).Seconds()
	out := result{Errors: map[string]int{}, Seconds: elapsed}
	var latencies []time.Duration
	verbs := map[string][]time.Duration{}
	for _, w := range all {
		for verb, took := range w.byVerb {
			latencies = append(latencies, took...)
			verbs[verb] = append(verbs[verb], took...)
		}
		out.Retried += w.retried
		for k, v := range w.errors {
			out.Errors[k] += v
		}
	}
	if *traceFile != "" {
		f, err := os.Create(*traceFile)
		if err != nil {
			panic(err)
		}
		encoder := json.NewEncoder(f)
		for _, w := range all {
			for _, one := range w.trace {
				encoder.Encode(one)
			}
		}
		f.Close()
	}
	out.Requests = len(latencies)
	out.PerSec = float64(out.Requests) / elapsed
	out.P50ms, out.P99ms = percentiles(latencies)
	out.Verbs = map[string]verbResult{}
	for verb, took := range verbs {
		p50, p99 := percentiles(took)
		out.Verbs[verb] = verbResult{len(took), p50, p99}
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
