package main

import (
	"encoding/json"
	"os"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
)

// line is one JSON line of output. Type is a watch event type (ADDED, MODIFIED, DELETED,
// BOOKMARK, ERROR), a handler-level kind (SYNC: an update that did not change the object, as a
// resync or a relist delivers it), or a marker (READY, RELIST, WATCH_ERROR).
type line struct {
	Type            string `json:"type"`
	Namespace       string `json:"namespace,omitempty"`
	Name            string `json:"name,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	// Initial marks the informer's adds from its initial list.
	Initial bool `json:"initial,omitempty"`
	// Tombstone marks a delete the informer inferred from a relist (DeletedFinalStateUnknown).
	Tombstone bool   `json:"tombstone,omitempty"`
	Code      int32  `json:"code,omitempty"`
	Error     string `json:"error,omitempty"`
}

// output writes lines one write(2) each: os.File is unbuffered, so every line reaches the
// reader as soon as the event is handled, and a killed process loses nothing it printed.
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
		panic(err) // a struct of strings always marshals
	}
	data = append(data, '\n')
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, err := o.file.Write(data); err != nil {
		// The reader is gone (the test ended): nothing useful is left to do.
		os.Exit(0)
	}
}

func (o *output) object(kind string, obj interface{}) line {
	l := line{Type: kind}
	if m, err := meta.Accessor(obj); err == nil {
		l.Namespace, l.Name, l.ResourceVersion = m.GetNamespace(), m.GetName(), m.GetResourceVersion()
	}
	return l
}

func (o *output) Close() error {
	if o.own {
		return o.file.Close()
	}
	return nil
}
