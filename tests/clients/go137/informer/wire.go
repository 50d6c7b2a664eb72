package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"
)

// wireTap sits above client-go's HTTP transport (after Go's transparent gzip decoding) and
// reports every event of every JSON watch body as it is read, before the reflector sees it:
// the tests time the initial-events-end bookmark with it, which an informer never hands to its
// handlers.
type wireTap struct {
	next http.RoundTripper
	out  *output
}

func (t *wireTap) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil {
		// Every answer, refusals included: the tests compare how the reflector got its
		// initial list (watch-list, or a fallback to LIST + WATCH) direct and through a proxy.
		verb := "list"
		if isWatch(req) {
			verb = "watch"
		}
		t.out.write(line{Type: "REQUEST", Event: verb, Query: req.URL.RawQuery, Code: int32(resp.StatusCode)})
	}
	if err != nil || !isWatch(req) || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	t.out.write(line{
		Type:  "WATCH",
		Query: req.URL.RawQuery,
		// Go's transport asked for gzip itself and decoded a gzip body: Uncompressed says so.
		Gzip: resp.Uncompressed,
	})
	reader, writer := io.Pipe()
	go t.scan(reader)
	resp.Body = &tappedBody{ReadCloser: resp.Body, copy: writer}
	return resp, nil
}

func isWatch(req *http.Request) bool {
	w := req.URL.Query().Get("watch")
	return req.Method == http.MethodGet && w != "" && w != "0" && !strings.EqualFold(w, "false")
}

// scan decodes the tapped copy one event at a time and writes a WIRE line for each.
func (t *wireTap) scan(r *io.PipeReader) {
	defer r.Close()
	dec := json.NewDecoder(r)
	for {
		var event struct {
			Type   string `json:"type"`
			Object struct {
				Metadata struct {
					ResourceVersion string            `json:"resourceVersion"`
					Annotations     map[string]string `json:"annotations"`
				} `json:"metadata"`
			} `json:"object"`
		}
		if err := dec.Decode(&event); err != nil {
			return
		}
		meta := event.Object.Metadata
		t.out.write(line{
			Type:             "WIRE",
			Event:            event.Type,
			ResourceVersion:  meta.ResourceVersion,
			InitialEventsEnd: meta.Annotations["k8s.io/initial-events-end"] == "true",
			At:               time.Now().UnixNano(),
		})
	}
}

// tappedBody hands the reflector's decoder what it reads and a copy to the scanner.
type tappedBody struct {
	io.ReadCloser
	copy *io.PipeWriter
}

func (b *tappedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		// The scanner only decodes: it never stops reading before the pipe closes.
		_, _ = b.copy.Write(p[:n])
	}
	if err != nil {
		_ = b.copy.CloseWithError(err)
	}
	return n, err
}

func (b *tappedBody) Close() error {
	_ = b.copy.Close()
	return b.ReadCloser.Close()
}
