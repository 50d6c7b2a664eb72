package main

import (
	"encoding/json"
	"os"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
)

// line is one JSON line of output: a handler call (ADDED, MODIFIED, SYNC, DELETED), a marker
// (READY, WATCH_ERROR), a request's answer (REQUEST: verb in event, status in code), a watch
// answered 200 (WATCH) or one event off the wire (WIRE).
type line struct {
	Type            string `json:"type"`
	Namespace       string `json:"namespace,omitempty"`
	Name            string `json:"name,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	Initial         bool   `json:"initial,omitempty"`
	Tombstone       bool   `json:"tombstone,omitempty"`
	Code            int32  `json:"code,omitempty"`
	Error           string `json:"error,omitempty"`
	// WATCH lines.
	Query string `json:"query,omitempty"`
	Gzip  bool   `json:"gzip,omitempty"`
	// WIRE lines.
	Event            string `json:"event,omitempty"`
	InitialEventsEnd bool   `json:"initialEventsEnd,omitempty"`
	At               int64  `json:"at,omitempty"`
}

// output writes each line with one write(2): a reader sees it at once, and a killed process
// loses nothing it printed.
type output struct {
	mu   sync.Mutex
	file *os.File
	own  bool
}

func openOutput(path string) (*output, error) {
	if path == "" {
		return &output{file: os.Stdout}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &output{file: f, own: true}, nil
}

func (o *output) write(l line) {
	data, err := json.Marshal(l)
	if err != nil {
		panic(err) // a struct of strings, bools and integers always marshals
	}
	data = append(data, '\n')
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, err := o.file.Write(data); err != nil {
		os.Exit(0) // the reader is gone (the test ended)
	}
}

func (o *output) Close() error {
	if o.own {
		return o.file.Close()
	}
	return nil
}

func objectLine(kind string, obj any) line {
	l := line{Type: kind}
	if m, err := meta.Accessor(obj); err == nil {
		l.Namespace, l.Name, l.ResourceVersion = m.GetNamespace(), m.GetName(), m.GetResourceVersion()
	}
	return l
}
