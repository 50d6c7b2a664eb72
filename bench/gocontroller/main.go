// Command gocontroller is the load of bench.controller: N workers that each loop, as fast as
// the server answers, over what a controller does with its objects: GET one, merge-PATCH it,
// LIST a small page, LIST everything in pages of 2, CREATE one of its own and DELETE it again.
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
}

type worker struct {
	client    *http.Client
	base      string
	token     string
	id        int
	latencies []time.Duration
	errors    map[string]int
	retried   int // 429s answered and retried
	userAgent string
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

func (w *worker) send(method, path, contentType string, body []byte) []byte {
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
	started := time.Now()
	var resp *http.Response
	var data []byte
	// As client-go's REST client: a 429 is retried up to 10 times after its Retry-After.
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			req.Body = io.NopCloser(bytes.NewReader(body))
		}
		resp, err = w.client.Do(req)
		if err != nil {
			w.errors["transport"]++
			return nil
		}
		data, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 429 || attempt == 10 {
			break
		}
		w.retried++
		seconds, convErr := strconv.Atoi(resp.Header.Get("Retry-After"))
		if convErr != nil || seconds < 1 {
			seconds = 1
		}
		time.Sleep(time.Duration(seconds) * time.Second)
	}
	w.latencies = append(w.latencies, time.Since(started))
	if err != nil {
		w.errors["body"]++
		return nil
	}
	if resp.StatusCode >= 300 {
		w.errors[fmt.Sprint(resp.StatusCode)]++
	}
	return data
}

func (w *worker) loop(ns string, until time.Time) {
	collection := "/api/v1/namespaces/" + ns + "/configmaps"
	mine := fmt.Sprintf("bench-controller-%d", w.id)
	shared := collection + "/bench-shared"
	for i := 0; time.Now().Before(until); i++ {
		w.do("GET", shared, "", nil)
		patch := fmt.Sprintf(`{"data":{"worker-%d":"%d"}}`, w.id, i)
		w.do("PATCH", shared, "application/merge-patch+json", []byte(patch))
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
	until := time.Now().Add(time.Duration(*seconds * float64(time.Second)))
	started := time.Now()
	all := make([]*worker, *workers)
	var wg sync.WaitGroup
	for i := range all {
		all[i] = &worker{client: client, base: *base, token: token, id: i, errors: map[string]int{},
			userAgent: *userAgent, until: until}
		if *userAgent == "" {
			all[i].userAgent = fmt.Sprintf("gocontroller/worker-%d", i)
		}
		wg.Add(1)
		go func(w *worker) { defer wg.Done(); w.loop(*ns, until) }(all[i])
	}
	wg.Wait()
	elapsed := time.Since(started).Seconds()
	out := result{Errors: map[string]int{}, Seconds: elapsed}
	var latencies []time.Duration
	for _, w := range all {
		latencies = append(latencies, w.latencies...)
		out.Retried += w.retried
		for k, v := range w.errors {
			out.Errors[k] += v
		}
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	out.Requests = len(latencies)
	out.PerSec = float64(out.Requests) / elapsed
	if n := len(latencies); n > 0 {
		out.P50ms = float64(latencies[n/2]) / 1e6
		out.P99ms = float64(latencies[n*99/100]) / 1e6
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
