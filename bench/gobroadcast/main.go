// Command gobroadcast is a TLS watch relay that can feed kubectl proxy's 500 watches.
//
// Why it exists: kubectl proxy opens one upstream watch per client. On a 2-core machine,
// kube-apiserver serving 500 watches at 100 events/s needs more than a core by itself, so
// kubectl proxy fell behind for lack of CPU and its measured CPU was whatever the machine had
// left. This relay stands where the apiserver's watch cache stands: it reads ONE watch from the
// real apiserver and writes each chunk of complete lines, undecoded, to every client stream. It
// speaks what the apiserver speaks to kubectl proxy (TLS, HTTP/2 by ALPN, chunked watch
// streams), so kubectl proxy does the work it does in a pod, with the CPU to do it.
//
// Usage: gobroadcast --upstream URL --token T --ca PATH --dir DIR; prints {"port","ca"} (the
// relay's own CA file, for kubectl's kubeconfig) and serves until stdin closes. Every GET is a
// watch: the first client of an idle relay opens the upstream watch with its path and query;
// clients that join a running broadcast get what follows. The upstream watch closes when the
// last client leaves.
package main

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

type relay struct {
	upstream string
	token    string
	client   *http.Client

	mu      sync.Mutex
	clients map[chan []byte]struct{}
	cancel  func() // ends the running upstream watch; nil when idle
}

// queueDepth bounds what one client may have pending; a client that falls this far behind is
// dropped (the bench counts it as lost events) instead of growing without bound.
const queueDepth = 4096

func (r *relay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	queue := make(chan []byte, queueDepth)
	r.join(queue, req.URL.RequestURI())
	defer r.leave(queue)
	for {
		select {
		case <-req.Context().Done():
			return
		case data, open := <-queue:
			if !open {
				return
			}
			if _, err := w.Write(data); err != nil {
				return
			}
			flusher.Flush()
		}
	}
}

func (r *relay) join(queue chan []byte, requestURI string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clients[queue] = struct{}{}
	if r.cancel == nil {
		done := make(chan struct{})
		r.cancel = sync.OnceFunc(func() { close(done) })
		go r.pump(requestURI, done)
	}
}

func (r *relay) leave(queue chan []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, there := r.clients[queue]; !there {
		return
	}
	delete(r.clients, queue)
	if len(r.clients) == 0 && r.cancel != nil {
		r.cancel()
		r.cancel = nil
	}
}

func (r *relay) broadcast(data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for queue := range r.clients {
		select {
		case queue <- data:
		default: // too far behind: end that client's stream
			delete(r.clients, queue)
			close(queue)
		}
	}
}

// pump reads the upstream watch and broadcasts each run of complete lines until done closes
// or the upstream ends; then every client's stream ends too.
func (r *relay) pump(requestURI string, done chan struct{}) {
	request, _ := http.NewRequest(http.MethodGet, r.upstream+requestURI, nil)
	request.Header.Set("Authorization", "Bearer "+r.token)
	response, err := r.client.Do(request)
	if err != nil {
		log.Printf("upstream watch: %v", err)
		r.endAll()
		return
	}
	go func() { <-done; response.Body.Close() }()
	if response.StatusCode != http.StatusOK {
		log.Printf("upstream watch: status %d", response.StatusCode)
		response.Body.Close()
		r.endAll()
		return
	}
	buf := make([]byte, 256<<10)
	var rest []byte
	for {
		n, err := response.Body.Read(buf)
		if n > 0 {
			data := append(rest, buf[:n]...)
			end := bytes.LastIndexByte(data, '\n')
			if end >= 0 {
				out := make([]byte, end+1) // shared read-only by every client
				copy(out, data[:end+1])
				r.broadcast(out)
				data = data[end+1:]
			}
			rest = append([]byte(nil), data...)
		}
		if err != nil {
			select {
			case <-done: // the last client left
			default:
				log.Printf("upstream watch ended: %v", err)
				r.endAll()
			}
			return
		}
	}
}

func (r *relay) endAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for queue := range r.clients {
		close(queue)
		delete(r.clients, queue)
	}
	if r.cancel != nil {
		r.cancel()
		r.cancel = nil
	}
}

// selfSigned makes a serving certificate for 127.0.0.1 and writes it to dir/relay-ca.crt.
func selfSigned(dir string) (tls.Certificate, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	template := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "gobroadcast"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	caPath := filepath.Join(dir, "relay-ca.crt")
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(caPath, certPEM, 0o600); err != nil {
		return tls.Certificate{}, "", err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, caPath, nil
}

func fail(message string) {
	line, _ := json.Marshal(map[string]string{"error": "gobroadcast: " + message})
	fmt.Println(string(line))
	os.Exit(2)
}

func main() {
	upstream := flag.String("upstream", "", "the apiserver's base URL")
	token := flag.String("token", "", "bearer token for the apiserver")
	caFile := flag.String("ca", "", "the apiserver's CA bundle")
	dir := flag.String("dir", "", "where to write the relay's CA")
	flag.Parse()
	if *upstream == "" || *dir == "" {
		fail("--upstream and --dir are required")
	}
	pool := x509.NewCertPool()
	if *caFile != "" {
		pemBytes, err := os.ReadFile(*caFile)
		if err != nil {
			fail(err.Error())
		}
		pool.AppendCertsFromPEM(pemBytes)
	}
	cert, caPath, err := selfSigned(*dir)
	if err != nil {
		fail(err.Error())
	}
	r := &relay{
		upstream: *upstream,
		token:    *token,
		client: &http.Client{Transport: &http.Transport{
			TLSClientConfig:    &tls.Config{RootCAs: pool},
			DisableCompression: true,
		}},
		clients: map[chan []byte]struct{}{},
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err.Error())
	}
	server := &http.Server{
		Handler:   r,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}},
		ErrorLog:  log.New(io.Discard, "", 0),
		// kube-apiserver's limit since the 2023 rapid-reset fix: kubectl proxy's 500 watches
		// then share five connections, as they do in a cluster.
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 100},
	}
	go func() {
		if err := server.ServeTLS(listener, "", ""); err != http.ErrServerClosed {
			log.Printf("serve: %v", err)
		}
	}()
	line, _ := json.Marshal(map[string]any{"port": listener.Addr().(*net.TCPAddr).Port, "ca": caPath})
	fmt.Println(string(line))
	// Serve until the orchestrator closes stdin (or says quit).
	commands := bufio.NewScanner(os.Stdin)
	for commands.Scan() {
		if commands.Text() == "quit" {
			break
		}
	}
	server.Close()
}
